"""Settings of the allocation agent (the kubelet plugin): shared groups plus its own fields.

Defaults are the kubelet's (socket directories of the Go kubeletplugin helper). Derived paths are
properties, never recomputed ad hoc. Validation raises `ConfigError` before anything opens.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from services.allocation.resource_names import parse_overrides
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

__all__ = [
    "BACKENDS",
    "CRASH_STEPS",
    "DEVICE_METADATA_MODES",
    "KUBELET_APIS",
    "KUBELET_DEVICE_PLUGIN_DIR",
    "KUBELET_PLUGINS_DIR",
    "KUBELET_REGISTRY_DIR",
    "AllocationConfig",
]

KUBELET_REGISTRY_DIR = Path("/var/lib/kubelet/plugins_registry")
KUBELET_PLUGINS_DIR = Path("/var/lib/kubelet/plugins")
KUBELET_DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
KUBELET_APIS = ("dra", "device-plugin")
BACKENDS = registry.NAMES
DEVICE_METADATA_MODES = ("auto", "on", "off")
"""`--device-metadata`: auto is on where the API server is Kubernetes 1.36 or newer."""
"""The device backends, as the discovery agent's `--backend` names them."""
# Driver and node names are DNS subdomains (lower case, at most 253 characters).
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# sun_path holds 108 bytes including the terminating NUL.
_MAX_SOCKET_PATH = 107
# A pod UID (RFC 4122) or any short name made of the characters a socket file name may carry.
_INSTANCE_UID = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,62})$")
CRASH_STEPS = (
    "prepare-started",
    "partition-created",
    "mps-started",
    "metadata-written",
    "cdi-written",
    "prepare-completed",
    "unprepare-cdi-removed",
    # A claim for a virtual machine (docs/vfio.md), in the binder's order.
    "vfio-recorded",
    "vfio-override-set",
    "vfio-unbound",
    "vfio-bound",
    "unprepare-vfio-override-restored",
    "unprepare-vfio-unbound",
)
"""Fault-injection points of `crash_at`, in the order a prepare/unprepare reaches them."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class AllocationConfig:
    nats: NATSSettings = dataclasses.field(default_factory=NATSSettings)
    kube: KubeSettings = dataclasses.field(default_factory=KubeSettings)
    log: LogSettings = dataclasses.field(default_factory=LogSettings)
    telemetry: TelemetrySettings = dataclasses.field(default_factory=TelemetrySettings)
    ops: OpsSettings = dataclasses.field(default_factory=OpsSettings)

    node_name: str = setting(
        "", flag="--node-name", help="This node's name; also the pool name. Empty: the hostname."
    )
    """Name of the Node object; the pool of every device this plugin prepares."""
    driver_name: str = setting(
        "sim.dra-suite.io", flag="--driver-name", help="DRA driver name (a DNS subdomain)."
    )
    """The driver name in ResourceSlices, allocation results and the kubelet registration."""
    backend: str = setting(
        "sim",
        flag="--backend",
        help="This node's device backend: sim, nvml or ascend (the discovery agent's). It "
        "picks the container edits and their allowlist; an inventory naming another is refused.",
    )
    """From the node's own configuration, never from the bus: a forged inventory cannot pick
    which vendor's edits and allowlist apply."""
    plugin_registry_dir: Path = setting(
        KUBELET_REGISTRY_DIR,
        flag="--plugin-registry-dir",
        help="Directory the kubelet watches for plugin registration sockets.",
    )
    """Where `<driver>-reg.sock` is created; the same path inside the container and on the host."""
    plugin_data_dir: Path | None = setting(
        None,
        flag="--plugin-data-dir",
        help="Directory of the DRA socket and the checkpoint; empty: kubelet plugins dir/<driver>.",
    )
    """Holds `dra.sock`, `checkpoint/` and `inventory.pb`; use `data_dir` for the resolved path."""
    cdi_root: Path = setting(
        Path("/var/run/cdi"), flag="--cdi-root", help="Directory of the dynamic CDI specs."
    )
    """Where one transient CDI spec per prepared claim is written."""
    health_resend_interval_s: float = setting(
        10.0,
        flag="--health-resend-interval-s",
        help="Period of the full device health list on each NodeWatchResources stream.",
    )
    """Must stay well below `health_check_timeout_s`, or the kubelet marks devices Unknown."""
    health_check_timeout_s: int = setting(
        30,
        flag="--health-check-timeout-s",
        help="DeviceHealth.health_check_timeout_seconds advertised to the kubelet.",
    )
    """How long the kubelet keeps a device's health without a refresh."""
    rolling_update_uid: str = setting(
        "",
        flag="--rolling-update-uid",
        help="This instance's pod UID: per-instance socket names and a cross-instance lock "
        "(kubelet 1.33+ only). Empty: off.",
    )
    """Set from the downward API (`metadata.uid`) so that two instances can serve at once."""
    replaced_claim_wait_s: float = setting(
        5.0,
        flag="--replaced-claim-wait-s",
        help="How long a prepare of a recreated claim (same name, new UID) waits for the old "
        "UID's unprepare before failing that claim.",
    )
    """Bounded, so that the kubelet's 45 s call deadline is never the one that fires."""
    inventory_wait_s: float = setting(
        10.0,
        flag="--inventory-wait-s",
        help="How long a prepare of a new claim waits for the node's first device inventory "
        "(a fresh agent may be serving before discovery's inventory reached it) before "
        "failing that claim.",
    )
    npu_smi_path: str = setting(
        "npu-smi",
        flag="--npu-smi-path",
        help="ascend: the npu-smi binary that makes and removes vNPU partitions.",
    )
    """Run only for claims that ask for a partition (`partition.profile`) of an NPU."""
    partition_timeout_s: float = setting(
        30.0,
        flag="--partition-timeout-s",
        help="nvml/ascend: seconds one partition step (an npu-smi run, the NVML calls of one "
        "MIG device) may take before the claim fails.",
    )
    """Below the kubelet's 45 s call deadline, so the claim gets our error, not a timeout."""
    mps_control_path: str = setting(
        "",
        flag="--mps-control-path",
        help="nvml/sim: the host's nvidia-cuda-mps-control (under the driver root) that runs "
        "one MPS control daemon per claim sharing a GPU, with the claim's limits. Empty: none "
        "(a share then gets only the MPS variables, which nothing enforces).",
    )
    """Run as a child process of the agent; see docs/sharing.md for why not a pod."""
    mps_timeout_s: float = setting(
        10.0,
        flag="--mps-timeout-s",
        help="Seconds one nvidia-cuda-mps-control run (start, limits, quit) may take.",
    )
    kubelet_api: str = setting(
        "dra",
        flag="--kubelet-api",
        help="The kubelet front: dra (DRA plugin) or device-plugin (kubelet device plugin API "
        "v1beta1, extended resources). One node runs one.",
    )
    """Which kubelet API this agent serves; the other front must not serve on the node."""
    device_plugin_dir: Path = setting(
        KUBELET_DEVICE_PLUGIN_DIR,
        flag="--device-plugin-dir",
        help="device-plugin front: the kubelet's device plugin directory (kubelet.sock).",
    )
    """Holds the kubelet's `kubelet.sock` and our `<driver>-<resource>.sock` sockets."""
    device_plugin_resources: str = setting(
        "",
        flag="--device-plugin-resources",
        help="device-plugin front: resource names by device kind or default name, e.g. "
        "npu=huawei.com/Ascend910,gpu=nvidia.com/gpu. Empty: the backend's defaults.",
    )
    """Parsed by `resource_names.parse_overrides`; see `device_plugin_overrides`."""
    device_metadata: str = setting(
        "auto",
        flag="--device-metadata",
        help="Device metadata files in containers (KEP-5304): auto (on from Kubernetes 1.36, "
        "asked of the API server at start), on or off.",
    )
    """Decides for claims prepared from now on; files of claims prepared before stay theirs."""
    device_status: bool = setting(
        True,
        flag="--device-status",
        help="Publish each prepared device's conditions and data in the claim's "
        "status.devices (KEP-4817).",
    )
    """Off: the agent never writes claim status (then its RBAC needs no status grant)."""
    sysfs_root: Path = setting(
        Path("/sys"),
        flag="--sysfs-root",
        help="Where sysfs is, for binding devices to vfio-pci (passthrough: vfio). sim: a sim "
        "tree other than /sys, whose kernel the agent plays; without one, no passthrough.",
    )
    """nvml/ascend write to it (the container needs /sys writable, docs/vfio.md)."""
    crash_at: str = ""
    """Fault-injection seam for the kill -9 tests, never a flag: `cli` fills it from the env var
    `DRA_SUITE_CRASH_AT` and the preparer exits the process (code 137) at that step."""

    def __post_init__(self) -> None:
        if not self.node_name:
            raise ConfigError("node name must not be empty", field="node_name")
        registry.require(self.backend)
        for field in ("node_name", "driver_name"):
            value = getattr(self, field)
            if len(value) > 253 or not _DNS_SUBDOMAIN.match(value):
                raise ConfigError(f"{field} {value!r} is not a DNS subdomain", field=field)
        if self.health_resend_interval_s <= 0:
            raise ConfigError(
                "health resend interval must be > 0", field="health_resend_interval_s"
            )
        if self.health_check_timeout_s <= self.health_resend_interval_s:
            raise ConfigError(
                f"health check timeout {self.health_check_timeout_s}s must exceed the resend "
                f"interval {self.health_resend_interval_s}s",
                field="health_check_timeout_s",
            )
        if self.rolling_update_uid and not _INSTANCE_UID.match(self.rolling_update_uid):
            raise ConfigError(
                f"rolling update uid {self.rolling_update_uid!r} must be letters, digits and "
                "dashes (at most 63)",
                field="rolling_update_uid",
            )
        if self.partition_timeout_s <= 0:
            raise ConfigError("partition timeout must be > 0", field="partition_timeout_s")
        if self.mps_timeout_s <= 0:
            raise ConfigError("mps timeout must be > 0", field="mps_timeout_s")
        # A claim UID is 36 characters; the daemon's socket path must fit sun_path.
        mps_socket = self.mps_dir / ("u" * 36) / "pipe" / "control"
        if self.mps_control_path and len(str(mps_socket).encode()) > _MAX_SOCKET_PATH:
            raise ConfigError(
                f"the MPS daemons' sockets ({mps_socket}) would exceed {_MAX_SOCKET_PATH} bytes; "
                "use a shorter plugin data directory",
                field="plugin_data_dir",
            )
        if self.replaced_claim_wait_s < 0:
            raise ConfigError("replaced claim wait must be >= 0", field="replaced_claim_wait_s")
        if self.inventory_wait_s < 0:
            raise ConfigError("inventory wait must be >= 0", field="inventory_wait_s")
        if self.device_metadata not in DEVICE_METADATA_MODES:
            raise ConfigError(
                f"device metadata {self.device_metadata!r} is not one of "
                f"{', '.join(DEVICE_METADATA_MODES)}",
                field="device_metadata",
            )
        if self.kubelet_api not in KUBELET_APIS:
            raise ConfigError(
                f"kubelet api {self.kubelet_api!r} is not one of {', '.join(KUBELET_APIS)}",
                field="kubelet_api",
            )
        try:
            parse_overrides(self.device_plugin_resources)
        except ValueError as exc:
            raise ConfigError(
                f"device plugin resources: {exc}", field="device_plugin_resources"
            ) from exc
        if self.crash_at and self.crash_at not in CRASH_STEPS:
            raise ConfigError(
                f"crash step {self.crash_at!r} is not one of {', '.join(CRASH_STEPS)}",
                field="crash_at",
            )
        for path in (self.dra_socket_path, self.registration_socket_path):
            if not path.is_absolute() or len(str(path).encode()) > _MAX_SOCKET_PATH:
                raise ConfigError(
                    f"socket path {path} must be absolute and at most {_MAX_SOCKET_PATH} bytes",
                    field="plugin_data_dir",
                )

    @property
    def device_plugin_overrides(self) -> dict[str, str]:
        """Resource names by device kind or default resource name (device-plugin front)."""
        return parse_overrides(self.device_plugin_resources)

    @property
    def pool_name(self) -> str:
        """One pool per node, named after the node."""
        return self.node_name

    @property
    def data_dir(self) -> Path:
        # An empty flag or env value parses as Path("."): it means "derive from the driver".
        if self.plugin_data_dir is None or str(self.plugin_data_dir) == ".":
            return KUBELET_PLUGINS_DIR / self.driver_name
        return self.plugin_data_dir

    @property
    def dra_socket_path(self) -> Path:
        """`dra.sock`, or `dra-<uid>.sock` with rolling updates (docs/contracts.md §2.1)."""
        if self.rolling_update_uid:
            return self.data_dir / f"dra-{self.rolling_update_uid}.sock"
        return self.data_dir / "dra.sock"

    @property
    def registration_socket_path(self) -> Path:
        """`<driver>-reg.sock`, or `<driver>-<uid>-reg.sock` with rolling updates."""
        if self.rolling_update_uid:
            name = f"{self.driver_name}-{self.rolling_update_uid}-reg.sock"
            return self.plugin_registry_dir / name
        return self.plugin_registry_dir / f"{self.driver_name}-reg.sock"

    @property
    def serialize_lock_path(self) -> Path:
        """The flock shared by all instances on this node when rolling updates are on."""
        return self.data_dir / "serialize.lock"

    @property
    def checkpoint_dir(self) -> Path:
        return self.data_dir / "checkpoint"

    @property
    def metadata_dir(self) -> Path:
        """Device metadata files, one directory per prepared claim UID (`metadata.files`)."""
        return self.data_dir / "dra-device-metadata"

    @property
    def mps_dir(self) -> Path:
        """One directory per claim with an MPS daemon: its pipe and log (`mps.daemons`)."""
        return self.data_dir / "mps"

    @property
    def vfio_ledger_path(self) -> Path:
        """The PCI functions bound to vfio-pci and their original drivers (`vfio.ledger`)."""
        return self.data_dir / "vfio-bindings.json"

    @property
    def inventory_path(self) -> Path:
        """The last inventory seen, so that a restart with NATS down still prepares."""
        return self.data_dir / "inventory.pb"
