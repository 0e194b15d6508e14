"""The resource types the emulator serves, and which are served for a config.

One `ResourceType` per group/version/plural. Resources that share `storage`
(DeviceTaintRule v1alpha3/v1beta2, core and events.k8s.io Events) are one set of
objects seen through different versions. Pure data; no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from devcluster.apiserver.config import ClusterConfig

__all__ = ["VERBS", "Registry", "ResourceType"]

VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
_META_FIELDS = frozenset({"metadata.name", "metadata.namespace"})


@dataclass(frozen=True, slots=True)
class ResourceType:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    storage: str
    """Objects of all ResourceTypes with the same storage key are one collection."""
    status_subresource: bool = False
    has_spec: bool = True
    """Objects with a spec get metadata.generation (bumped when spec changes)."""
    spec_immutable: bool = False
    field_labels: frozenset[str] | None = _META_FIELDS
    """Field selector labels the server accepts; None accepts any field path."""

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def qualified(self) -> str:
        """`plural.group` as used in kube error messages."""
        return f"{self.plural}.{self.group}" if self.group else self.plural


_R = "resource.k8s.io"
_EVENT_FIELDS = None  # core and events.k8s.io events accept any field path here


def _taint_rules(config: ClusterConfig) -> list[ResourceType]:
    minor = config.minor
    gate = "DRADeviceTaints" if minor == 34 else "DRADeviceTaintRules"
    if not config.enabled(gate):
        return []
    versions = ["v1alpha3"] if minor < 36 else ["v1beta2", "v1alpha3"]
    return [
        ResourceType(_R, v, "devicetaintrules", "DeviceTaintRule", False,
                     storage=f"{_R}/devicetaintrules", status_subresource=minor >= 35)
        for v in versions
    ]  # fmt: skip


def _all(config: ClusterConfig) -> list[ResourceType]:
    slice_fields = _META_FIELDS | {"spec.nodeName", "spec.driver"}
    pod_fields = _META_FIELDS | {
        "spec.nodeName", "spec.restartPolicy", "spec.schedulerName", "spec.serviceAccountName",
        "spec.hostNetwork", "status.phase", "status.podIP", "status.nominatedNodeName",
    }  # fmt: skip
    return [
        ResourceType("", "v1", "namespaces", "Namespace", False, storage="namespaces",
                     status_subresource=True, field_labels=_META_FIELDS | {"status.phase"}),
        ResourceType("", "v1", "nodes", "Node", False, storage="nodes", status_subresource=True,
                     field_labels=_META_FIELDS | {"spec.unschedulable"}),
        ResourceType("", "v1", "pods", "Pod", True, storage="pods", status_subresource=True,
                     field_labels=pod_fields),
        ResourceType("", "v1", "events", "Event", True, storage="events", has_spec=False,
                     field_labels=_EVENT_FIELDS),
        ResourceType("", "v1", "serviceaccounts", "ServiceAccount", True,
                     storage="serviceaccounts", has_spec=False),
        ResourceType("", "v1", "configmaps", "ConfigMap", True, storage="configmaps",
                     has_spec=False),
        ResourceType("events.k8s.io", "v1", "events", "Event", True, storage="events",
                     has_spec=False, field_labels=_EVENT_FIELDS),
        ResourceType(_R, "v1", "resourceslices", "ResourceSlice", False,
                     storage=f"{_R}/resourceslices", field_labels=slice_fields),
        ResourceType(_R, "v1", "deviceclasses", "DeviceClass", False,
                     storage=f"{_R}/deviceclasses"),
        ResourceType(_R, "v1", "resourceclaims", "ResourceClaim", True,
                     storage=f"{_R}/resourceclaims", status_subresource=True,
                     spec_immutable=True),
        ResourceType(_R, "v1", "resourceclaimtemplates", "ResourceClaimTemplate", True,
                     storage=f"{_R}/resourceclaimtemplates", spec_immutable=True),
        *_taint_rules(config),
    ]  # fmt: skip


class Registry:
    """Lookups over the resource types served for one `ClusterConfig`."""

    def __init__(self, config: ClusterConfig) -> None:
        self.types = _all(config)
        self._by_path = {(t.group, t.version, t.plural): t for t in self.types}
        self._by_gvk = {(t.api_version, t.kind): t for t in self.types}
        self._by_plural: dict[str, ResourceType] = {}
        for t in self.types:  # first listed version of a plural is the preferred one
            self._by_plural.setdefault(t.plural, t)

    def lookup(self, group: str, version: str, plural: str) -> ResourceType | None:
        return self._by_path.get((group, version, plural))

    def for_kind(self, api_version: str, kind: str) -> ResourceType | None:
        return self._by_gvk.get((api_version, kind))

    def for_plural(self, plural: str) -> ResourceType | None:
        """The preferred version of `plural` (`resourceclaims`, `devicetaintrules`, ...)."""
        return self._by_plural.get(plural)

    def group_versions(self) -> dict[str, list[str]]:
        """Served versions per group (core group is ""), most preferred first."""
        out: dict[str, list[str]] = {}
        for t in self.types:
            versions = out.setdefault(t.group, [])
            if t.version not in versions:
                versions.append(t.version)
        for versions in out.values():
            versions.sort(key=_version_priority)
        return out

    def in_group_version(self, group: str, version: str) -> Iterable[ResourceType]:
        return [t for t in self.types if t.group == group and t.version == version]


def _version_priority(version: str) -> tuple[int, int, int]:
    """Kube's ordering: GA before beta before alpha, higher numbers first."""
    for rank, marker in ((1, "beta"), (2, "alpha")):
        if marker in version:
            major, _, minor = version[1:].partition(marker)
            return (rank, -int(major), -int(minor or 0))
    return (0, -int(version[1:]), 0)
