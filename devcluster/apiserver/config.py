"""Emulated cluster settings: Kubernetes minor version, feature gates, limits.

Default gates follow docs/contracts.md §4.5 for the chosen version; `for_tests()` turns
on the DRA taint gates that our tests exercise. No I/O here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

__all__ = ["DEFAULT_GATES", "SUPPORTED_VERSIONS", "ClusterConfig", "parse_gates"]

SUPPORTED_VERSIONS = ("1.34", "1.35", "1.36")

DEFAULT_GATES: Mapping[str, Mapping[str, bool]] = MappingProxyType(
    {
        "1.34": MappingProxyType(
            {
                "DRAAdminAccess": True,
                "DRAPrioritizedList": True,
                "DRAPartitionableDevices": False,
                "DRAConsumableCapacity": False,
                "DRADeviceBindingConditions": False,
                "DRAExtendedResource": False,
                "DRAResourceClaimDeviceStatus": True,
                "DRADeviceTaints": False,
            }
        ),
        "1.35": MappingProxyType(
            {
                "DRAAdminAccess": True,
                "DRAPrioritizedList": True,
                "DRAPartitionableDevices": False,
                "DRAConsumableCapacity": False,
                "DRADeviceBindingConditions": False,
                "DRAExtendedResource": False,
                "DRAResourceClaimDeviceStatus": True,
                "DRADeviceTaints": False,
                "DRADeviceTaintRules": False,
            }
        ),
        "1.36": MappingProxyType(
            {
                "DRAAdminAccess": True,
                "DRAPrioritizedList": True,
                "DRAPartitionableDevices": True,
                "DRAConsumableCapacity": True,
                "DRADeviceBindingConditions": True,
                "DRAExtendedResource": True,
                "DRAResourceClaimDeviceStatus": True,
                "DRADeviceTaints": True,
                "DRADeviceTaintRules": False,
                "DRAListTypeAttributes": False,
                "DRANodeAllocatableResources": False,
            }
        ),
    }
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterConfig:
    """What the emulated kube-apiserver is; passed to `APIServerEmulator`."""

    kubernetes_version: str = "1.36"
    """Emulated minor version: "1.34", "1.35" or "1.36" (a "v" prefix and patch are accepted)."""

    feature_gates: Mapping[str, bool] = field(default_factory=dict)
    """Overrides on top of the version's default gates; an unknown gate is a ValueError."""

    token: str | None = None
    """When set, API requests must carry `Authorization: Bearer <token>` (else 401)."""

    watch_history: int = 10_000
    """Watch events kept for resuming watches; older resourceVersions get 410."""

    request_log_size: int = 100_000
    """Request log entries kept (oldest dropped first)."""

    bookmark_interval_s: float = 1.0
    """How often a watch with allowWatchBookmarks gets a BOOKMARK event."""

    def __post_init__(self) -> None:
        minor = _minor(self.kubernetes_version)
        if minor not in SUPPORTED_VERSIONS:
            raise ValueError(f"kubernetes version {self.kubernetes_version!r} not supported")
        object.__setattr__(self, "kubernetes_version", minor)
        unknown = sorted(set(self.feature_gates) - set(DEFAULT_GATES[minor]))
        if unknown:
            raise ValueError(f"unknown feature gates for {minor}: {', '.join(unknown)}")
        if self.watch_history < 1 or self.request_log_size < 1:
            raise ValueError("watch_history and request_log_size must be positive")

    @classmethod
    def for_tests(cls, kubernetes_version: str = "1.36", **feature_gates: bool) -> ClusterConfig:
        """Defaults for the version plus DRADeviceTaints/DRADeviceTaintRules on."""
        minor = _minor(kubernetes_version)
        gates = {"DRADeviceTaints": True}
        if "DRADeviceTaintRules" in DEFAULT_GATES.get(minor, {}):
            gates["DRADeviceTaintRules"] = True
        gates.update(feature_gates)
        return cls(kubernetes_version=minor, feature_gates=gates)

    @property
    def gates(self) -> dict[str, bool]:
        """Effective gates: version defaults with overrides applied."""
        return {**DEFAULT_GATES[self.kubernetes_version], **self.feature_gates}

    def enabled(self, gate: str) -> bool:
        return bool(self.feature_gates.get(gate, DEFAULT_GATES[self.kubernetes_version].get(gate)))

    @property
    def minor(self) -> int:
        return int(self.kubernetes_version.split(".")[1])

    @property
    def git_version(self) -> str:
        return f"v{self.kubernetes_version}.0"


def _minor(version: str) -> str:
    parts = version.removeprefix("v").split(".")
    return ".".join(parts[:2])


def parse_gates(text: str) -> dict[str, bool]:
    """Parse kube's `--feature-gates` syntax: `A=true,B=false`."""
    gates: dict[str, bool] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep or value.lower() not in ("true", "false"):
            raise ValueError(f"invalid feature gate {item!r}: want Name=true|false")
        gates[name.strip()] = value.lower() == "true"
    return gates
