"""DeviceTaintRule names, labels and bodies: deterministic, and valid for the API server."""

from __future__ import annotations

import re

import pytest

from devcluster.apiserver import ClusterConfig
from devcluster.apiserver.registry import Registry
from devcluster.apiserver.validation import Validator
from services.health import taints
from services.health.policy import Taint
from services.health.taints import RuleSpec

DRIVER = "sim.dra-suite.io"
TAINT = Taint(key=f"{DRIVER}/xid", value="79", effect="NoSchedule")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
LONG_NODE = ".".join(["n" * 63] * 3) + "." + "x" * 61  # 253 characters


def spec(*, node: str = "node-a", device: str = "gpu-0", taint: Taint = TAINT) -> RuleSpec:
    name = taints.rule_name(driver=DRIVER, node=node, device=device, key=taint.key)
    return RuleSpec(name=name, driver=DRIVER, node=node, pool=node, device=device, taint=taint)


@pytest.mark.parametrize(
    ("node", "device", "key"),
    [
        ("node-a", "gpu-0", f"{DRIVER}/xid"),
        ("worker.example.com", "npu-7", f"{DRIVER}/XID_Error.v2"),
        (LONG_NODE, "gpu-0", f"{DRIVER}/xid"),
        (LONG_NODE, "d" * 63, f"{DRIVER}/{'c' * 63}"),
    ],
    ids=["short", "dotted node and odd key", "longest node", "everything long"],
)
def test_rule_names_are_dns_subdomains_within_253_characters(node, device, key):
    name = taints.rule_name(driver=DRIVER, node=node, device=device, key=key)
    assert len(name) <= 253
    assert _SUBDOMAIN.match(name), name
    assert name == taints.rule_name(driver=DRIVER, node=node, device=device, key=key)


def test_rule_names_differ_per_device_node_driver_and_key():
    base = {"driver": DRIVER, "node": "n", "device": "gpu-0", "key": f"{DRIVER}/xid"}
    variants = [
        base,
        {**base, "device": "gpu-1"},
        {**base, "node": "m"},
        {**base, "driver": "other.io"},
        {**base, "key": f"{DRIVER}/ecc"},
        {**base, "key": f"{DRIVER}/XID"},  # sanitizes to the same text; the hash keeps it apart
    ]
    names = {taints.rule_name(**v) for v in variants}
    assert len(names) == len(variants)


def test_rule_name_reads_node_device_and_cause():
    name = taints.rule_name(driver=DRIVER, node="node-a", device="gpu-0", key=f"{DRIVER}/xid")
    assert name.startswith("node-a.gpu-0.xid-")


@pytest.mark.parametrize("node", ["node-a", LONG_NODE], ids=["short node", "longest node"])
def test_rule_labels_are_valid_label_values_and_select_the_rule(node):
    labels = taints.rule_labels(driver=DRIVER, node=node, device="gpu-0")
    for value in labels.values():
        assert len(value) <= 63
        assert _LABEL_VALUE.match(value)
    selector = taints.rule_selector(driver=DRIVER, node=node)
    for term in selector.split(","):
        key, _, value = term.partition("=")
        assert labels[key] == value


@pytest.mark.parametrize(
    ("kubernetes_version", "version"),
    [("1.36", "v1beta2"), ("1.36", "v1alpha3"), ("1.35", "v1alpha3"), ("1.34", "v1alpha3")],
    ids=["1.36 v1beta2", "1.36 v1alpha3", "1.35 v1alpha3", "1.34 v1alpha3"],
)
@pytest.mark.parametrize(
    "rule",
    [
        spec(),
        spec(node=LONG_NODE, device="d" * 63),
        spec(taint=Taint(key=f"{DRIVER}/ecc", value="", effect="NoExecute")),
    ],
    ids=["plain", "long names", "empty value"],
)
def test_rule_bodies_pass_the_api_servers_validation(kubernetes_version, version, rule):
    config = ClusterConfig.for_tests(kubernetes_version)
    rt = Registry(config).lookup("resource.k8s.io", version, "devicetaintrules")
    assert rt is not None
    body = taints.rule_body(rule, version=version)
    validator = Validator(config)
    validator.typemeta(rt, body)
    validator.schema(rt, body)
    validator.semantics(rt, body, None)


def test_rule_body_selects_exactly_the_device_of_the_pool():
    body = taints.rule_body(spec(), version="v1beta2")
    assert body["spec"] == {
        "deviceSelector": {"driver": DRIVER, "pool": "node-a", "device": "gpu-0"},
        "taint": {"key": f"{DRIVER}/xid", "value": "79", "effect": "NoSchedule"},
    }
    assert body["apiVersion"] == "resource.k8s.io/v1beta2"


def test_rule_body_keeps_a_given_time_added():
    body = taints.rule_body(spec(), version="v1alpha3", time_added="2026-01-01T00:00:00Z")
    assert body["spec"]["taint"]["timeAdded"] == "2026-01-01T00:00:00Z"


def test_spec_of_reads_back_what_rule_body_wrote():
    rule = spec(taint=Taint(key=f"{DRIVER}/ecc", value="", effect="None"))
    assert taints.spec_of(taints.rule_body(rule, version="v1beta2"), node="node-a") == rule
