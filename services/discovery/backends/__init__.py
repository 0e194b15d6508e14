"""Device backends: the `DeviceBackend` seam and `load_backend`, which picks one by config.

A backend only enumerates devices and signals that they may have changed; it never talks to
NATS or Kubernetes. `scan()` may be called at any time and must be side-effect free.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from services.discovery.config import DiscoveryConfig
from shared.errors import BackendLoadError
from shared.pb.drasuite.v1 import inventory_pb2

if TYPE_CHECKING:
    from services.discovery.backends.nvml_api import NVMLLibrary
    from shared.commands import CommandRunner

__all__ = ["LOADERS", "BackendSeams", "Closeable", "DeviceBackend", "Scan", "load_backend"]


@dataclass(frozen=True, slots=True)
class Scan:
    """What one scan found: devices and the counter sets their partitions consume."""

    devices: tuple[inventory_pb2.Device, ...]
    shared_counters: tuple[inventory_pb2.CounterSet, ...] = ()


class DeviceBackend(Protocol):
    """Enumerates the node's devices (sim profile, NVML, npu-smi)."""

    name: str
    """Backend name as recorded in the inventory: "sim", "nvml", "ascend"."""

    changed: asyncio.Event
    """Set when the devices may have changed (hot-plug); the scanner clears it, then scans."""

    async def scan(self) -> Scan:
        """Enumerate the devices now; BackendUnavailableError when the backend is down."""
        ...

    async def watch(self) -> None:
        """Eternal: notice hot-plug and attribute changes and set `changed`."""
        ...


@runtime_checkable
class Closeable(Protocol):
    """A backend that holds a library or handle to release when the agent stops."""

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class BackendSeams:
    """Stand-ins for the hardware interfaces (tests, the local stack); None: the real one."""

    nvml: NVMLLibrary | None = None
    """The NVML library (`tests/fakes/nvml.py` has a fake); None: pynvml."""
    run_command: CommandRunner | None = None
    """How npu-smi is run; None: a subprocess."""


def load_backend(config: DiscoveryConfig, *, seams: BackendSeams | None = None) -> DeviceBackend:
    """The backend named by `config.backend`; BackendLoadError when it cannot be used."""
    loader = LOADERS.get(config.backend)
    if loader is None:
        raise BackendLoadError(f"unknown backend {config.backend}", backend=config.backend)
    return loader(config, seams or BackendSeams())


def _load_sim(config: DiscoveryConfig, _: BackendSeams) -> DeviceBackend:
    from services.discovery.backends import sim
    from services.discovery.backends.sysfs import DEFAULT_ROOT, Sysfs

    # Sim devices are never real: a sim sysfs tree only (docs/vfio.md), never the host's /sys.
    sim_tree = str(config.sysfs_root) not in ("", DEFAULT_ROOT)
    sysfs = Sysfs(config.sysfs_root) if sim_tree else None
    return sim.SimBackend.from_profile(config.sim_profile, sysfs=sysfs)


def _load_nvml(config: DiscoveryConfig, seams: BackendSeams) -> DeviceBackend:
    from services.discovery.backends import nvml, nvml_api
    from services.discovery.backends.sysfs import Sysfs

    options = nvml.NvmlOptions(
        mig_profiles=config.mig_profiles,
        pci_bus_id=config.publish_pci_bus_id,
        timeout_s=config.backend_timeout_s,
        poll_s=config.backend_poll_s,
    )
    library = seams.nvml or nvml_api.open_library()
    return nvml.NvmlBackend.open(library, options=options, sysfs=Sysfs(config.sysfs_root))


def _load_ascend(config: DiscoveryConfig, seams: BackendSeams) -> DeviceBackend:
    from services.discovery.backends import ascend
    from services.discovery.backends.sysfs import Sysfs
    from shared import commands

    return ascend.AscendBackend(
        npu_smi=config.npu_smi_path,
        run_command=seams.run_command or commands.run_command,
        sysfs=Sysfs(config.sysfs_root),
        timeout_s=config.backend_timeout_s,
        poll_s=config.backend_poll_s,
    )


LOADERS: Mapping[str, Callable[[DiscoveryConfig, BackendSeams], DeviceBackend]] = {
    "sim": _load_sim,
    "nvml": _load_nvml,
    "ascend": _load_ascend,
}
"""Discovery's backend per `--backend` name (`shared/vendors/registry.py` names them all)."""
