"""The DeviceTaintRule admission policy (deploy/kustomize/admission/devicetaintrules.yaml), its
CEL evaluated with celpy on admission requests carrying the rules the health agent itself builds
(services/health/rule_objects.py): the agent writes only rules that select its own node's
devices, whatever the node its service-account token is bound to."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from services.health.policy import Taint
from services.health.rule_objects import LABEL_NODE, RuleSpec, rule_body, rule_name
from tests.unit.deploy.manifests import (
    KUBECTL,
    KUSTOMIZE,
    NODE_KEY,
    OVERLAYS,
    SIM,
    _docs,
    admission_policy,
    admission_request,
    evaluate_policy,
    policy_with_driver,
    render,
)

POLICY = "dra-suite-devicetaintrules-own-node"
HEALTH_USER = "system:serviceaccount:dra-suite:dra-health"
LONG_NODE = "ip-10-0-12-34.eu-west-1.compute.internal.with-a-very-long-cluster-suffix.example"
FAULT = Taint(key=f"{SIM}/ecc", value="double-bit", effect="NoSchedule")


def _rule(node: str, *, pool: str | None = None, device: str = "npu-3", driver: str = SIM) -> Any:
    """A DeviceTaintRule exactly as the health agent on `node` writes it."""
    spec = RuleSpec(
        name=rule_name(driver=driver, node=node, device=device, key=FAULT.key),
        driver=driver,
        node=node,
        pool=node if pool is None else pool,
        device=device,
        taint=FAULT,
    )
    return rule_body(spec, version="v1beta2")


def _without_selector(rule: Any) -> Any:
    changed = copy.deepcopy(rule)
    del changed["spec"]["deviceSelector"]
    return changed


def _whole_pool(rule: Any) -> Any:
    changed = copy.deepcopy(rule)
    del changed["spec"]["deviceSelector"]["device"]
    return changed


def _labelled(rule: Any, node: str | None) -> Any:
    changed = copy.deepcopy(rule)
    if node is None:
        del changed["metadata"]["labels"][LABEL_NODE]
    else:
        changed["metadata"]["labels"][LABEL_NODE] = node
    return changed


ON_A = {NODE_KEY: ["node-a"], "authentication.kubernetes.io/pod-name": ["dra-health-x"]}
SELECTOR = "the health agent on node node-a may only write DeviceTaintRules whose deviceSelector"
LABEL = "the health agent on node node-a may only write DeviceTaintRules labelled"
NO_NODE = "the health agent's request carries no node name"
CASES: list[tuple[Any, ...]] = [  # (operation, object, oldObject, user, extra, matched, denial)
    ("CREATE", _rule("node-a"), None, HEALTH_USER, ON_A, True, None),
    ("UPDATE", _rule("node-a"), _rule("node-a"), HEALTH_USER, ON_A, True, None),
    ("DELETE", None, _rule("node-a"), HEALTH_USER, ON_A, True, None),
    ("CREATE", _rule("node-b"), None, HEALTH_USER, ON_A, True, SELECTOR),
    ("CREATE", _rule("node-a", pool="node-b"), None, HEALTH_USER, ON_A, True, SELECTOR),
    ("CREATE", _without_selector(_rule("node-a")), None, HEALTH_USER, ON_A, True, SELECTOR),
    ("CREATE", _whole_pool(_rule("node-a")), None, HEALTH_USER, ON_A, True, SELECTOR),
    ("CREATE", _rule("node-a", driver="gpu.example.com"), None, HEALTH_USER, ON_A, True, SELECTOR),
    ("CREATE", _labelled(_rule("node-a"), "node-b"), None, HEALTH_USER, ON_A, True, LABEL),
    ("CREATE", _labelled(_rule("node-a"), None), None, HEALTH_USER, ON_A, True, LABEL),
    ("UPDATE", _rule("node-b"), _rule("node-b"), HEALTH_USER, ON_A, True, SELECTOR),
    ("UPDATE", _rule("node-a"), _rule("node-b"), HEALTH_USER, ON_A, True, SELECTOR),
    ("DELETE", None, _rule("node-b"), HEALTH_USER, ON_A, True, SELECTOR),
    ("CREATE", _rule("node-a"), None, HEALTH_USER, None, True, NO_NODE),
    ("CREATE", _rule("node-a"), None, HEALTH_USER, {NODE_KEY: []}, True, NO_NODE),
    ("CREATE", _rule(LONG_NODE), None, HEALTH_USER, {NODE_KEY: [LONG_NODE]}, True, None),
    ("CREATE", _rule("node-b"), None, "system:serviceaccount:other:dra-health", ON_A, False, None),
    ("DELETE", None, _rule("node-b"), "system:kube-controller-manager", None, False, None),
    ("CREATE", _rule("node-b"), None, "kubernetes-admin", None, False, None),
    (
        "DELETE",
        None,
        _rule("node-b"),
        "system:serviceaccount:dra-suite:dra-discovery",
        ON_A,
        False,
        None,
    ),
]
IDS = [
    "the agent creates a rule for a device of its own node",
    "the agent updates a rule of its own node",
    "the agent deletes a rule of its own node",
    "the agent may not create a rule for another node",
    "the agent may not select another node's pool under its own labels",
    "the agent may not create a rule without a device selector",
    "the agent may not taint its whole pool at once",
    "the agent may not taint another driver's devices",
    "the agent may not label a rule with another node",
    "the agent may not leave the node label out",
    "the agent may not update another node's rule",
    "the agent may not rewrite another node's rule into one of its own",
    "the agent may not delete another node's rule",
    "a token without a bound node is refused",
    "an empty node-name extra is refused",
    "a node name too long for a label is checked by its selector",
    "a namesake account in another namespace is not matched",
    "the controller manager is not matched",
    "an administrator is not matched",
    "the discovery agent is not matched",
]


@pytest.mark.parametrize(
    ("operation", "obj", "old", "user", "extra", "matched", "denial"), CASES, ids=IDS
)
def test_taint_rule_policy_lets_the_health_agent_write_only_its_nodes_rules(
    operation, obj, old, user, extra, matched, denial
):
    policy = admission_policy("devicetaintrules.yaml", POLICY)
    request = admission_request(
        resource="devicetaintrules", operation=operation, obj=obj, old=old, user=user, extra=extra
    )
    verdict = evaluate_policy(policy, request)
    assert verdict.matched == matched
    if denial is None:
        assert verdict.allowed, verdict.denials
    else:
        assert any(d.startswith(denial) for d in verdict.denials), verdict.denials


def test_taint_rule_policy_names_the_health_agents_account_and_every_write():
    policy = admission_policy("devicetaintrules.yaml", POLICY)
    (account,) = [
        d for d in _docs(KUSTOMIZE / "base" / "rbac-health.yaml") if d["kind"] == "ServiceAccount"
    ]
    meta = account["metadata"]
    assert f"system:serviceaccount:{meta['namespace']}:{meta['name']}" == HEALTH_USER
    (condition,) = policy["spec"]["matchConditions"]
    assert f"'{HEALTH_USER}'" in condition["expression"]
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert set(rule["operations"]) == {"CREATE", "UPDATE", "DELETE"}
    assert rule["resources"] == ["devicetaintrules"]
    assert rule["apiVersions"] == ["*"], "whichever version the agent negotiates"


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not on PATH")
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_overlay_points_the_taint_rule_policy_at_its_driver(overlay):
    (policy,) = [
        d
        for d in render(f"overlays/{overlay}")
        if d["kind"] == "ValidatingAdmissionPolicy" and d["metadata"]["name"] == POLICY
    ]
    driver = OVERLAYS[overlay][0]
    assert policy == policy_with_driver(policy, driver)
    own = admission_request(
        resource="devicetaintrules",
        operation="CREATE",
        obj=_rule("node-a", driver=driver),
        user=HEALTH_USER,
        extra=ON_A,
    )
    assert evaluate_policy(policy, own).allowed
