"""Who reports a span or a series: the agent's resource, `target_info` and `dra_build_info`."""

from __future__ import annotations

import subprocess
import sys

import pytest

from shared.resource import agent_resource, build_version


def test_resource_names_service_version_node_and_driver() -> None:
    attributes = agent_resource(
        service="dra-health", node="node-a", driver="npu.huawei.com", environ={}
    ).attributes
    assert attributes["service.name"] == "dra-health"
    assert attributes["service.namespace"] == "dra-suite"
    assert attributes["service.version"] == build_version()
    assert attributes["k8s.node.name"] == "node-a"
    assert attributes["dra.driver.name"] == "npu.huawei.com"


def test_resource_leaves_out_an_unknown_node_and_driver() -> None:
    attributes = agent_resource(service="dractl", environ={}).attributes
    assert "k8s.node.name" not in attributes
    assert "dra.driver.name" not in attributes


@pytest.mark.parametrize(
    ("environ", "key", "expected"),
    [
        ({"OTEL_SERVICE_NAME": "npu-health"}, "service.name", "npu-health"),
        ({"OTEL_RESOURCE_ATTRIBUTES": "k8s.cluster.name=prod-1"}, "k8s.cluster.name", "prod-1"),
        ({"OTEL_RESOURCE_ATTRIBUTES": "k8s.node.name=renamed"}, "k8s.node.name", "renamed"),
        ({"OTEL_RESOURCE_ATTRIBUTES": "team=ml%20infra, ,bad"}, "team", "ml infra"),
    ],
    ids=["service-name", "extra-attribute", "override", "percent-encoded-and-junk"],
)
def test_standard_variables_override_the_agents_attributes(
    environ: dict[str, str], key: str, expected: str
) -> None:
    resource = agent_resource(service="dra-health", node="node-a", environ=environ)
    assert resource.attributes[key] == expected


def test_metrics_expose_target_info_with_node_and_driver_and_build_info() -> None:
    # The meter provider is once per process, so a fresh interpreter configures it.
    script = (
        "from shared import metrics\n"
        "metrics.configure(service='dra-discovery', node='node-7', driver='sim.dra-suite.io',"
        " environ={})\n"
        "print(metrics.render().decode())\n"
    )
    text = subprocess.run(
        [sys.executable, "-c", script], check=True, capture_output=True, text=True, timeout=30
    ).stdout
    target_info = next(line for line in text.splitlines() if line.startswith("target_info{"))
    assert 'k8s_node_name="node-7"' in target_info
    assert 'dra_driver_name="sim.dra-suite.io"' in target_info
    assert 'service_name="dra-discovery"' in target_info
    build_info = next(line for line in text.splitlines() if line.startswith("dra_build_info{"))
    assert f'version="{build_version()}"' in build_info
    assert 'service="dra-discovery"' in build_info
    assert build_info.endswith(" 1.0")
