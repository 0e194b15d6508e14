"""Discovery documents: /version, /api, /apis, /apis/<group>, and APIResourceLists.

Built from the registry for the emulated version and gates. Pure.
"""

from __future__ import annotations

from typing import Any

from devcluster.apiserver.config import ClusterConfig
from devcluster.apiserver.registry import VERBS, Registry

__all__ = ["api_group", "api_group_list", "api_versions", "resource_list", "version_info"]

_STATUS_VERBS = ["get", "patch", "update"]


def version_info(config: ClusterConfig) -> dict[str, Any]:
    major, minor = config.kubernetes_version.split(".")
    return {
        "major": major,
        "minor": minor,
        "emulationMajor": major,
        "emulationMinor": minor,
        "gitVersion": config.git_version,
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.25.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    }


def api_versions(server_address: str) -> dict[str, Any]:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [
            {"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}
        ],
    }


def api_group(registry: Registry, group: str) -> dict[str, Any] | None:
    versions = registry.group_versions().get(group)
    if not group or not versions:
        return None
    entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": group,
        "versions": entries,
        "preferredVersion": entries[0],
    }


def api_group_list(registry: Registry) -> dict[str, Any]:
    groups = [api_group(registry, g) for g in registry.group_versions() if g]
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [g for g in groups if g]}


def resource_list(registry: Registry, group: str, version: str) -> dict[str, Any] | None:
    types = list(registry.in_group_version(group, version))
    if not types:
        return None
    resources: list[dict[str, Any]] = []
    for t in types:
        resources.append({
            "name": t.plural, "singularName": t.singular, "namespaced": t.namespaced,
            "kind": t.kind, "verbs": list(VERBS),
        })  # fmt: skip
        if t.status_subresource:
            resources.append({
                "name": f"{t.plural}/status", "singularName": "", "namespaced": t.namespaced,
                "kind": t.kind, "verbs": list(_STATUS_VERBS),
            })  # fmt: skip
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group}/{version}" if group else version,
        "resources": resources,
    }
