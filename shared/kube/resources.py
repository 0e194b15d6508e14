"""The Kubernetes resource types dra-suite reads or writes, and their REST paths."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "DEVICE_CLASSES",
    "EVENTS",
    "NODES",
    "PODS",
    "RESOURCE_CLAIMS",
    "RESOURCE_GROUP",
    "RESOURCE_SLICES",
    "ResourceType",
    "device_taint_rules",
]

RESOURCE_GROUP = "resource.k8s.io"


@dataclass(frozen=True, slots=True)
class ResourceType:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, *, namespace: str | None = None, name: str = "", subresource: str = "") -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name:
            base += f"/{name}"
            if subresource:
                base += f"/{subresource}"
        return base


NODES = ResourceType("", "v1", "nodes", "Node", namespaced=False)
PODS = ResourceType("", "v1", "pods", "Pod", namespaced=True)
EVENTS = ResourceType("", "v1", "events", "Event", namespaced=True)
RESOURCE_SLICES = ResourceType(RESOURCE_GROUP, "v1", "resourceslices", "ResourceSlice", False)
RESOURCE_CLAIMS = ResourceType(RESOURCE_GROUP, "v1", "resourceclaims", "ResourceClaim", True)
DEVICE_CLASSES = ResourceType(RESOURCE_GROUP, "v1", "deviceclasses", "DeviceClass", False)


def device_taint_rules(version: str) -> ResourceType:
    """DeviceTaintRule in the given resource.k8s.io version (v1alpha3, v1beta2, v1)."""
    return ResourceType(RESOURCE_GROUP, version, "devicetaintrules", "DeviceTaintRule", False)
