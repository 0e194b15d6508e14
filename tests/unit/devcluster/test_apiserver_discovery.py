"""Discovery documents per emulated Kubernetes version and feature gates."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client

from devcluster.apiserver import APIServerEmulator, ClusterConfig


async def _get(server: APIServerEmulator, path: str) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as session, session.get(server.url + path) as response:
        return response.status, await response.json()


@pytest.mark.parametrize(
    ("version", "gates", "taint_versions"),
    [
        ("1.34", {}, []),
        ("1.34", {"DRADeviceTaints": True}, ["v1alpha3"]),
        ("1.35", {"DRADeviceTaints": True}, []),
        ("1.35", {"DRADeviceTaintRules": True}, ["v1alpha3"]),
        ("1.36", {}, []),
        ("1.36", {"DRADeviceTaintRules": True}, ["v1beta2", "v1alpha3"]),
    ],
    ids=[
        "1.34-default", "1.34-taints-gate", "1.35-taints-gate-only", "1.35-taint-rules-gate",
        "1.36-default", "1.36-taint-rules-gate",
    ],
)  # fmt: skip
async def test_device_taint_rule_versions_follow_version_and_gates(version, gates, taint_versions):
    config = ClusterConfig(kubernetes_version=version, feature_gates=gates)
    async with APIServerEmulator(config) as server:
        _, groups = await _get(server, "/apis")
        [resource] = [g for g in groups["groups"] if g["name"] == "resource.k8s.io"]
        served = [v["version"] for v in resource["versions"]]
        assert served == ["v1", *taint_versions]
        assert resource["preferredVersion"] == {
            "groupVersion": "resource.k8s.io/v1",
            "version": "v1",
        }
        for taint_version in taint_versions:
            status, listing = await _get(server, f"/apis/resource.k8s.io/{taint_version}")
            assert status == 200
            assert listing["resources"][0]["name"] == "devicetaintrules"
        status, _ = await _get(server, "/apis/resource.k8s.io/v1alpha3/devicetaintrules")
        assert status == (200 if taint_versions else 404)


@pytest.mark.parametrize("version", ["1.34", "1.35", "1.36"], ids=["1.34", "1.35", "1.36"])
async def test_version_endpoint_reports_emulated_version(version):
    async with APIServerEmulator(kubernetes_version=version) as server:
        _, info = await _get(server, "/version")
    assert info["gitVersion"] == f"v{version}.0"
    assert info["minor"] == version.split(".")[1]


async def test_resource_v1_lists_resources_with_status_subresource(apiserver):
    _, listing = await _get(apiserver, "/apis/resource.k8s.io/v1")
    by_name = {r["name"]: r for r in listing["resources"]}
    assert listing["kind"] == "APIResourceList"
    assert listing["groupVersion"] == "resource.k8s.io/v1"
    assert set(by_name) == {
        "resourceslices", "deviceclasses", "resourceclaims", "resourceclaims/status",
        "resourceclaimtemplates",
    }  # fmt: skip
    assert by_name["resourceslices"]["namespaced"] is False
    assert by_name["resourceclaims"]["namespaced"] is True
    assert by_name["resourceclaims/status"]["verbs"] == ["get", "patch", "update"]
    assert "deletecollection" in by_name["resourceslices"]["verbs"]
    assert by_name["resourceslices"]["kind"] == "ResourceSlice"


async def test_core_api_discovery(apiserver):
    _, versions = await _get(apiserver, "/api")
    _, listing = await _get(apiserver, "/api/v1")
    assert versions["versions"] == ["v1"]
    names = {r["name"] for r in listing["resources"]}
    assert {"nodes", "namespaces", "pods", "events"} <= names


async def test_unserved_group_is_not_found(apiserver):
    status, body = await _get(apiserver, "/apis/apps")
    assert status == 404
    assert body["reason"] == "NotFound"


async def test_kubernetes_asyncio_reads_discovery(kube):
    groups = await client.ApisApi(kube).get_api_versions()
    assert "resource.k8s.io" in [g.name for g in groups.groups]
    version = await client.VersionApi(kube).get_code()
    assert version.git_version == "v1.36.0"


def test_unknown_feature_gate_is_rejected():
    with pytest.raises(ValueError, match="DRADeviceTaintRules"):
        ClusterConfig(kubernetes_version="1.34", feature_gates={"DRADeviceTaintRules": True})


def test_for_tests_config_enables_taint_gates():
    config = ClusterConfig.for_tests()
    assert config.enabled("DRADeviceTaints")
    assert config.enabled("DRADeviceTaintRules")
    assert ClusterConfig().enabled("DRADeviceTaintRules") is False
