"""The shipped alerting rules as Prometheus's own tools read them.

`promtool check rules` accepts the rule file; the PrometheusRule of
components/prometheus-operator carries the same groups; docker-compose.yml mounts the file
where deploy/compose/prometheus.yaml loads it; and `promtool test rules` shows each rule firing
after its shipped `for:` on synthetic series (the live fault flow, test_alerts_live.py, runs a
copy without `for:` so it needs no minutes of waiting).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.observability.promstack import RULES, require_binaries, short_for_copy

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
PROMETHEUS_RULE = REPO / "deploy/kustomize/components/prometheus-operator/prometheusrule.yaml"
EXPECTED = {
    "DRAUnhealthyDevices",
    "DRADevicesTainted",
    "DRAAgentNotReady",
    "DRANATSDisconnected",
    "DRAPrepareErrors",
    "DRABusRecordsRejected",
    "DRABusQuotaExceeded",
}
# One agent's resource, as every agent exports it (shared/resource.py).
_TARGET = 'job="dra-suite", instance="node-a:9100"'
_INFO = (
    f'target_info{{{_TARGET}, k8s_node_name="node-a", dra_driver_name="sim.dra-suite.io", '
    'service_name="dra-health", service_namespace="dra-suite"}'
)
_NODE = {"k8s_node_name": "node-a", "dra_driver_name": "sim.dra-suite.io"}
_AGENT = {"k8s_node_name": "node-a", "service_name": "dra-health"}


def _rules(path: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8"))
    return loaded


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    binaries = require_binaries()
    return subprocess.run(
        [binaries.promtool, *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_promtool_accepts_the_shipped_rules() -> None:
    checked = _promtool("check", "rules", str(RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(EXPECTED)} rules found" in checked.stdout


def test_the_rules_are_the_seven_alerts_each_with_a_severity_and_a_summary() -> None:
    rules = [rule for group in _rules(RULES)["groups"] for rule in group["rules"]]
    assert {rule["alert"] for rule in rules} == EXPECTED
    for rule in rules:
        assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
        assert {"summary", "description"} <= set(rule["annotations"]), rule["alert"]


def test_the_prometheus_rule_object_carries_the_same_groups() -> None:
    (rule,) = yaml.safe_load_all(PROMETHEUS_RULE.read_text(encoding="utf-8"))
    assert (rule["apiVersion"], rule["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert rule["spec"]["groups"] == _rules(RULES)["groups"]
    component = yaml.safe_load((PROMETHEUS_RULE.parent / "kustomization.yaml").read_text())
    assert PROMETHEUS_RULE.name in component["resources"]


def test_compose_prometheus_loads_the_shipped_rules() -> None:
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text(encoding="utf-8"))
    config = yaml.safe_load((REPO / "deploy/compose/prometheus.yaml").read_text())
    mounts = dict(
        volume.removesuffix(":ro").split(":", 1)
        for volume in compose["services"]["prometheus"]["volumes"]
    )
    inside = mounts[f"./{RULES.relative_to(REPO)}"]
    assert inside in config["rule_files"]


def test_the_short_for_copy_only_drops_for_and_labels_its_alerts(tmp_path: Path) -> None:
    shipped = _rules(RULES)["groups"]
    copied = _rules(short_for_copy(RULES, tmp_path / "copy.yaml"))["groups"]
    for original, copy in zip(shipped, copied, strict=True):
        assert copy["name"] == f"{original['name']}-short-for"
        for rule, twin in zip(original["rules"], copy["rules"], strict=True):
            assert twin["expr"] == rule["expr"]
            assert "for" not in twin
            assert twin["labels"] == {**rule["labels"], "rules": "short-for"}
    checked = _promtool("check", "rules", str(tmp_path / "copy.yaml"))
    assert checked.returncode == 0, checked.stdout + checked.stderr


def _alert(name: str, labels: dict[str, str], at: str) -> dict[str, Any]:
    rule = next(r for g in _rules(RULES)["groups"] for r in g["rules"] if r["alert"] == name)
    return {
        "eval_time": at,
        "alertname": name,
        "exp_alerts": [{"exp_labels": {**labels, **rule["labels"], "job": "dra-suite",
                                       "instance": "node-a:9100"}}],
    }  # fmt: skip


def _silent(name: str, at: str) -> dict[str, Any]:
    """Not firing at `at` (pending or inactive: promtool sees only firing alerts)."""
    return {"eval_time": at, "alertname": name, "exp_alerts": []}


def _without_annotations(dest: Path) -> Path:
    """The shipped rules (expressions, `for:`, labels) minus the annotations, which promtool's
    unit tests would compare as rendered text; `check rules` covers their templates."""
    doc = _rules(RULES)
    for group in doc["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations")
    dest.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return dest


def test_each_shipped_rule_fires_after_its_for_on_synthetic_series(tmp_path: Path) -> None:
    """Minute by minute: a device goes unhealthy and tainted at 1m, the agent turns unready
    and loses NATS at 1m, a prepare fails at 2m; each alert is silent before its `for:`."""
    series = [
        {"series": _INFO, "values": "1x30"},
        {"series": f'dra_devices{{{_TARGET}, health="unhealthy"}}', "values": "0 1x29"},
        {"series": f'dra_devices{{{_TARGET}, health="unknown"}}', "values": "0x30"},
        {"series": f'dra_tainted_devices{{{_TARGET}, effect="NoSchedule"}}', "values": "0 1x29"},
        {"series": f'dra_tainted_devices{{{_TARGET}, effect="None"}}', "values": "0 1x29"},
        {"series": f"dra_agent_ready{{{_TARGET}}}", "values": "1 0x29"},
        {"series": f"up{{{_TARGET}}}", "values": "1x30"},
        {"series": f"dra_nats_connected{{{_TARGET}}}", "values": "1 0x29"},
        {
            "series": f'dra_claim_failures_total{{{_TARGET}, operation="prepare"}}',
            "values": "0 0 1x28",
        },
        {
            "series": f'dra_bus_records_rejected_total{{{_TARGET}, reason="wrong_owner"}}',
            "values": "0 0 0 2x27",
        },
        {
            "series": f'dra_bus_quota_exceeded_total{{{_TARGET}, bucket="dra_health"}}',
            "values": "0 0 1x28",
        },
    ]
    unhealthy = {**_NODE, "health": "unhealthy"}
    tainted = {**_NODE, "effect": "NoSchedule"}
    tests = {
        "rule_files": [str(_without_annotations(tmp_path / "rules.yaml"))],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [
                    _silent("DRAUnhealthyDevices", "1m"),
                    _alert("DRAUnhealthyDevices", unhealthy, "2m"),
                    _silent("DRADevicesTainted", "1m"),
                    _alert("DRADevicesTainted", tainted, "2m"),
                    _silent("DRANATSDisconnected", "2m"),
                    _alert("DRANATSDisconnected", _AGENT, "3m"),
                    _silent("DRAAgentNotReady", "5m"),
                    _alert("DRAAgentNotReady", _AGENT, "6m"),
                    _silent("DRAPrepareErrors", "1m"),
                    _alert("DRAPrepareErrors", {**_NODE, "operation": "prepare"}, "2m"),
                    # 10 minutes after the last failure the window holds none: resolved.
                    _silent("DRAPrepareErrors", "13m"),
                    _silent("DRABusRecordsRejected", "2m"),
                    _alert("DRABusRecordsRejected", {**_AGENT, "reason": "wrong_owner"}, "3m"),
                    _silent("DRABusRecordsRejected", "14m"),
                    _silent("DRABusQuotaExceeded", "1m"),
                    _alert("DRABusQuotaExceeded", {"bucket": "dra_health"}, "2m"),
                    _silent("DRABusQuotaExceeded", "13m"),
                ],
            }
        ],
    }
    path = tmp_path / "rules_test.yaml"
    path.write_text(yaml.safe_dump(tests, sort_keys=False), encoding="utf-8")
    tested = _promtool("test", "rules", str(path))
    assert tested.returncode == 0, tested.stdout + tested.stderr
