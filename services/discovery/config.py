"""Settings of the discovery agent: the shared groups plus its own flags.

Validated in `__post_init__` (ConfigError, exit 2) before any connection opens. No I/O here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from shared.config import (
    KubeSettings,
    LogSettings,
    NATSSettings,
    OpsSettings,
    TelemetrySettings,
    setting,
)
from shared.errors import ConfigError
from shared.vendors import registry

__all__ = ["BACKENDS", "KUBELET_API_LABEL", "PUBLISH_SLICES_MODES", "DiscoveryConfig"]

BACKENDS = registry.NAMES
KUBELET_API_LABEL = "dra-suite.io/kubelet-api"
"""Node label naming the node's kubelet front: `device-plugin`, or absent/`dra` for DRA."""
PUBLISH_SLICES_MODES = ("true", "false", "auto")
_MIG_PROFILE = re.compile(r"^(\d+c\.)?\d+g\.\d+gb([+-][a-z]+)*$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


@dataclass(frozen=True, slots=True, kw_only=True)
class DiscoveryConfig:
    nats: NATSSettings = field(default_factory=NATSSettings)
    kube: KubeSettings = field(default_factory=KubeSettings)
    log: LogSettings = field(default_factory=LogSettings)
    telemetry: TelemetrySettings = field(default_factory=TelemetrySettings)
    ops: OpsSettings = field(default_factory=OpsSettings)

    node_name: str = setting(
        "", flag="--node-name", help="Name of this node; empty: the host name."
    )
    """The Node the slices belong to (owner, spec.nodeName); cli fills in the host name."""

    driver_name: str = setting(
        "sim.dra-suite.io", flag="--driver-name", help="DRA driver name (a DNS subdomain)."
    )
    """spec.driver of every slice and the domain of unqualified attribute names."""

    backend: str = setting("sim", flag="--backend", help="Device backend: sim, nvml or ascend.")
    """Which device backend enumerates the devices."""

    sim_profile: str = setting(
        "mixed", flag="--sim-profile", help="Sim backend profile: a shipped name or a YAML path."
    )
    """Profile of the sim backend; a path is re-read whenever the file changes (hot-plug)."""

    rescan_interval_s: float = setting(
        30.0, flag="--rescan-interval-s", help="Seconds between periodic backend scans."
    )
    """Slow periodic scan, on top of the backend's own change notifications."""

    pool_name: str = setting(
        "", flag="--pool-name", help="Pool the devices are published in; empty: the node name."
    )
    """Raw setting; use `pool` for the effective name."""

    mig_profiles: tuple[str, ...] = setting(
        (),
        flag="--mig-profiles",
        help="nvml: MIG profiles to publish as partitions, comma-separated (1g.10gb,3g.40gb).",
    )
    """Each placement of these profiles becomes a device sharing its GPU's counters."""

    publish_pci_bus_id: bool = setting(
        False,
        flag="--publish-pci-bus-id",
        help="nvml: publish resource.kubernetes.io/pciBusID (a standard attribute from 1.36).",
    )

    publish_slices: str = setting(
        "true",
        flag="--publish-slices",
        help="true: publish the node's devices as ResourceSlices (DRA); false: a node served "
        "by the device-plugin front (the inventory still goes to the bus, and this driver's "
        "slices on the node are deleted); auto: false when the Node is labelled "
        "dra-suite.io/kubelet-api=device-plugin, read at start.",
    )
    """No slices on device-plugin nodes, so the scheduler never hands their devices out twice."""

    publish_device_taints: bool = setting(
        False,
        flag="--publish-device-taints",
        help="Publish the health agent's device taints inside the ResourceSlices (run the "
        "health agent with --taint-target slice).",
    )
    """Watch the health KV and put each device's taints in `devices[].taints` of its slice."""

    npu_smi_path: str = setting(
        "npu-smi", flag="--npu-smi-path", help="ascend: the npu-smi binary (name or path)."
    )

    sysfs_root: str = setting(
        "/sys", flag="--sysfs-root", help="Where sysfs is mounted (PCIe root and NUMA node)."
    )

    backend_timeout_s: float = setting(
        10.0,
        flag="--backend-timeout-s",
        help="nvml/ascend: seconds one hardware scan (NVML, npu-smi) may take.",
    )

    backend_poll_s: float = setting(
        10.0,
        flag="--backend-poll-s",
        help="nvml/ascend: seconds between hardware rescans (there are no hot-plug events).",
    )

    def __post_init__(self) -> None:
        if not self.node_name:
            raise ConfigError("node name must not be empty", field="node_name")
        if len(self.driver_name) > 63 or not _DNS_SUBDOMAIN.match(self.driver_name):
            raise ConfigError(
                f"driver name {self.driver_name!r} must be a lower-case DNS subdomain of at "
                "most 63 characters",
                field="driver_name",
            )
        if self.publish_slices not in PUBLISH_SLICES_MODES:
            raise ConfigError(
                f"publish slices {self.publish_slices!r} is not one of "
                f"{', '.join(PUBLISH_SLICES_MODES)}",
                field="publish_slices",
            )
        registry.require(self.backend)
        for name in ("rescan_interval_s", "backend_timeout_s", "backend_poll_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive", field=name)
        for profile in self.mig_profiles:
            if not _MIG_PROFILE.match(profile):
                raise ConfigError(
                    f"MIG profile {profile!r} is not a profile name like 1g.10gb or 1g.10gb+me",
                    field="mig_profiles",
                )
        if len(self.pool) > 253 or not all(
            _DNS_SUBDOMAIN.match(part) for part in self.pool.split("/")
        ):
            raise ConfigError(
                f"pool name {self.pool!r} must be DNS subdomains separated by '/', "
                "at most 253 characters",
                field="pool_name",
            )

    @property
    def pool(self) -> str:
        """The effective pool name: `pool_name`, else the node name."""
        return self.pool_name or self.node_name
