"""The discovery agent's device backend seam and what a backend loader is given.

A backend only enumerates devices and signals that they may have changed; it never talks to
NATS or Kubernetes. `scan()` may be called at any time and must be side-effect free.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from shared.pb.drasuite.v1 import inventory_pb2

if TYPE_CHECKING:
    from shared.commands import CommandRunner
    from shared.vendors.nvidia.nvml_api import NVMLLibrary

__all__ = [
    "BackendLoader",
    "BackendSeams",
    "Closeable",
    "DeviceBackend",
    "DiscoverySettings",
    "Scan",
]


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


class DiscoverySettings(Protocol):
    """The discovery agent's settings a backend loader reads (its config satisfies this)."""

    @property
    def sim_profile(self) -> str: ...
    @property
    def sysfs_root(self) -> str: ...
    @property
    def mig_profiles(self) -> tuple[str, ...]: ...
    @property
    def publish_pci_bus_id(self) -> bool: ...
    @property
    def npu_smi_path(self) -> str: ...
    @property
    def backend_timeout_s(self) -> float: ...
    @property
    def backend_poll_s(self) -> float: ...


BackendLoader = Callable[[DiscoverySettings, BackendSeams], DeviceBackend]
"""Opens a vendor's backend; BackendLoadError when it cannot be used."""
