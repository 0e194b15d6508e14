"""The NVML backend: NVIDIA GPUs through the `NVMLLibrary` seam, and their MIG slots.

A scan reads everything in one worker thread (`asyncio.to_thread`) under a timeout: NVML
calls block, and a wedged driver must not stall the agent. While a timed-out read is still
stuck in the driver, later scans fail fast instead of piling up threads. NVML has no hot-plug
events, so `watch()` asks for a rescan every `poll_s`.

Per GPU: `type`, `uuid`, `index`, `productName`, `architecture`, `cudaComputeCapability`,
`driverVersion`, `cudaDriverVersion` (semver), `resource.kubernetes.io/pcieRoot` (sysfs),
`resource.kubernetes.io/pciBusID` (only when `pci_bus_id` is on), `numaNode` (sysfs),
`migCapable`, `interconnectGroup` (NVLink-connected set) and capacity `memory`; with an IOMMU
group (sysfs), `iommuGroup`, `vfioViable` and `pciBusID` (docs/vfio.md; not on MIG devices).

MIG (see `mig`): with `mig_profiles` set, every slot of those profiles (a profile at one
placement) is published as an option made on demand (`createdOnDemand`, no UUID) while it is
free (overlaps no GPU instance, its profile below its instance limit) *and* while a MIG device
sits exactly there: the allocation agent makes that MIG device when a claim that got the slot
is prepared (or hands over the one already there) and destroys what it made at unprepare, so
the slot's published device must not change with that instance's life. Its UUID is a fact of
one claim and goes into that claim's CDI spec and status, never into the slice, where it
would outlive the instance until the next scan. A MIG device of any other profile (an
administrator's layout) is published with its UUID. Hopper and later offer the options
whatever the MIG mode; Ampere only while MIG is on. A GPU instance with several compute
instances is not published (its MIG devices are not one slot), and no option overlaps it.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TypeVar

import structlog

from shared import quantity
from shared.errors import BackendLoadError, BackendUnavailableError
from shared.pb.drasuite.v1 import inventory_pb2
from shared.vendors.nvidia import mig_devices as mig
from shared.vendors.nvidia import naming
from shared.vendors.nvidia.mig import GpuInstance, MigDevice, MigProfile
from shared.vendors.nvidia.nvml_api import (
    NVLINK_MAX_LINKS,
    PROFILE_ENUM_COUNT,
    Handle,
    NVMLCallError,
    NVMLLibrary,
)
from shared.vendors.parts import topology
from shared.vendors.parts.discovery import Scan
from shared.vendors.parts.sysfs import Sysfs, normalize_bus_id, vfio_attributes
from shared.vfio.pci import Viability

__all__ = [
    "ARCHITECTURES",
    "GpuReading",
    "NvmlBackend",
    "NvmlOptions",
    "Reading",
    "cuda_version",
    "read",
    "semver",
    "to_scan",
]

log = structlog.get_logger(__name__)
T = TypeVar("T")

ARCHITECTURES = {
    2: "Kepler",
    3: "Maxwell",
    4: "Pascal",
    5: "Volta",
    6: "Turing",
    7: "Ampere",
    8: "Ada",
    9: "Hopper",
    10: "Blackwell",
    13: "Rubin",
}
_HOPPER = 9
_VERSION = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?$")
_CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")


@dataclass(frozen=True, slots=True, kw_only=True)
class NvmlOptions:
    mig_profiles: tuple[str, ...] = ()
    """MIG profile names to publish as partitions (`1g.10gb`, `3g.40gb`, …); empty: none."""
    pci_bus_id: bool = False
    """Publish `resource.kubernetes.io/pciBusID` (a standard attribute from k8s 1.36 on)."""
    timeout_s: float = 10.0
    poll_s: float = 10.0


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuReading:
    """What one scan learnt about one GPU (NVML and sysfs)."""

    index: int
    minor: int
    uuid: str
    name: str
    architecture: int
    compute_capability: tuple[int, int]
    memory_bytes: int
    bus_id: str
    pcie_root: str | None = None
    numa_node: int | None = None
    mig_mode: tuple[int, int] | None = None
    """(current, pending); None when the GPU cannot do MIG."""
    profiles: tuple[MigProfile, ...] = ()
    gpu_instances: tuple[GpuInstance, ...] = ()
    """The GPU instances that exist (read while MIG is on)."""
    mig_devices: tuple[MigDevice, ...] = ()
    """The MIG devices that exist, with their UUIDs (read while MIG is on)."""
    nvlink_peers: tuple[str, ...] = ()
    """Bus ids at the far end of active NVLinks (peer GPUs or NVSwitches)."""
    vfio: Viability | None = None
    """Its IOMMU group and whether it may pass through to a VM (sysfs)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Reading:
    driver_version: str
    cuda_driver_version: int
    gpus: tuple[GpuReading, ...] = field(default_factory=tuple)


def _optional(call: Callable[[], T]) -> T | None:
    """The call's result, or None when the GPU lacks the feature."""
    try:
        return call()
    except NVMLCallError as exc:
        if exc.unsupported:
            return None
        raise


def _profiles(library: NVMLLibrary, handle: Handle) -> tuple[MigProfile, ...]:
    found: dict[int, MigProfile] = {}
    for enum in range(PROFILE_ENUM_COUNT):
        info = _optional(partial(library.gpu_instance_profile, handle, enum))
        if info is None or info.id in found:
            continue
        placements = _optional(partial(library.gpu_instance_placements, handle, info.id))
        found[info.id] = MigProfile(info, tuple(placements or ()))
    return tuple(found.values())


def _gpu_instances(
    library: NVMLLibrary, handle: Handle, profiles: tuple[MigProfile, ...]
) -> tuple[GpuInstance, ...]:
    found: list[GpuInstance] = []
    for profile in profiles:
        found += _optional(partial(library.gpu_instances, handle, profile.info.id)) or ()
    return tuple(sorted(found, key=lambda gi: gi.id))


def _nvlink_peers(library: NVMLLibrary, handle: Handle) -> tuple[str, ...]:
    peers: list[str] = []
    for link in range(NVLINK_MAX_LINKS):
        if not _optional(partial(library.nvlink_active, handle, link)):
            continue
        remote = _optional(partial(library.nvlink_remote_bus_id, handle, link))
        if remote:
            peers.append(normalize_bus_id(remote))
    return tuple(sorted(set(peers)))


def _read_gpu(library: NVMLLibrary, index: int, *, sysfs: Sysfs, with_profiles: bool) -> GpuReading:
    handle = library.handle_by_index(index)
    bus_id = normalize_bus_id(library.pci_bus_id(handle))
    mig_mode = _optional(partial(library.mig_mode, handle))
    mig_on = mig_mode is not None and mig_mode[0] == 1
    profiles = _profiles(library, handle) if mig_on or (with_profiles and mig_mode) else ()
    return GpuReading(
        index=index,
        minor=library.minor_number(handle),
        uuid=library.uuid(handle),
        name=library.name(handle),
        architecture=library.architecture(handle),
        compute_capability=library.cuda_compute_capability(handle),
        memory_bytes=library.memory_total(handle),
        bus_id=bus_id,
        pcie_root=sysfs.pcie_root(bus_id),
        numa_node=sysfs.numa_node(bus_id),
        mig_mode=mig_mode,
        profiles=profiles,
        gpu_instances=_gpu_instances(library, handle, profiles) if mig_on else (),
        mig_devices=(_optional(partial(library.mig_devices, handle)) or ()) if mig_on else (),
        nvlink_peers=_nvlink_peers(library, handle),
        vfio=sysfs.vfio(bus_id),
    )


def read(library: NVMLLibrary, *, sysfs: Sysfs, with_profiles: bool) -> Reading:
    """Everything a scan needs, read in one go (blocking; NVMLCallError on a failed call)."""
    count = library.device_count()
    return Reading(
        driver_version=library.driver_version(),
        cuda_driver_version=library.cuda_driver_version(),
        gpus=tuple(
            _read_gpu(library, i, sysfs=sysfs, with_profiles=with_profiles) for i in range(count)
        ),
    )


def semver(version: str) -> str | None:
    """NVML's `580.95.05` as semver `580.95.5` (leading zeros dropped); None if not numeric."""
    match = _VERSION.match(version.strip())
    if match is None:
        return None
    return ".".join(str(int(part or "0")) for part in match.groups())


def cuda_version(version: int) -> str:
    """NVML's CUDA driver version int (12040) as semver (`12.4.0`)."""
    return f"{version // 1000}.{version % 1000 // 10}.0"


def _gpu_device(
    gpu: GpuReading, *, reading: Reading, options: NvmlOptions, groups: dict[int, str]
) -> inventory_pb2.Device:
    device = inventory_pb2.Device(
        name=naming.gpu_name(gpu.index),
        kind="gpu",
        uuid=gpu.uuid,
        capacity={"memory": quantity.binary(gpu.memory_bytes)},
        device_nodes=[
            inventory_pb2.DeviceNode(path=path)
            for path in (f"/dev/nvidia{gpu.minor}", *_CONTROL_NODES)
        ],
        env={"NVIDIA_VISIBLE_DEVICES": gpu.uuid},
    )
    attributes = device.attributes
    attributes["type"].string = "gpu"
    attributes["uuid"].string = gpu.uuid
    attributes["index"].int = gpu.index
    attributes["productName"].string = gpu.name
    attributes["architecture"].string = ARCHITECTURES.get(gpu.architecture, "Unknown")
    attributes["cudaComputeCapability"].version = "{}.{}.0".format(*gpu.compute_capability)
    if driver := semver(reading.driver_version):
        attributes["driverVersion"].version = driver
    attributes["cudaDriverVersion"].version = cuda_version(reading.cuda_driver_version)
    if gpu.pcie_root is not None:
        attributes["resource.kubernetes.io/pcieRoot"].string = gpu.pcie_root
    if options.pci_bus_id:
        attributes["resource.kubernetes.io/pciBusID"].string = gpu.bus_id
    if gpu.numa_node is not None:
        attributes["numaNode"].int = gpu.numa_node
    attributes["migCapable"].bool = gpu.mig_mode is not None
    if gpu.index in groups:
        attributes["interconnectGroup"].string = groups[gpu.index]
    return device


def _interconnect_groups(gpus: tuple[GpuReading, ...]) -> dict[int, str]:
    """GPUs joined by NVLink, directly or through the same NVSwitches: `nvlink-<k>`."""
    by_bus = {gpu.bus_id: gpu.index for gpu in gpus}
    links = [(gpu.index, by_bus.get(peer, peer)) for gpu in gpus for peer in gpu.nvlink_peers]
    return topology.groups((gpu.index for gpu in gpus), links, prefix="nvlink-")


def _options_wanted(gpu: GpuReading, options: NvmlOptions) -> bool:
    """Hopper and later always offer MIG placements; Ampere only when MIG is already on."""
    if not options.mig_profiles or gpu.mig_mode is None or not gpu.profiles:
        return False
    return gpu.mig_mode[0] == 1 or gpu.architecture >= _HOPPER


def _existing(gpu: GpuReading) -> dict[int, MigDevice]:
    """GPU instance id -> its MIG device, for the instances that hold exactly one."""
    by_instance: dict[int, list[MigDevice]] = {}
    for device in gpu.mig_devices:
        by_instance.setdefault(device.gpu_instance, []).append(device)
    return {gi: devices[0] for gi, devices in by_instance.items() if len(devices) == 1}


def _slots(
    whole: inventory_pb2.Device,
    gpu: GpuReading,
    options: NvmlOptions,
    counters: inventory_pb2.CounterSet,
) -> list[inventory_pb2.Device]:
    """Per profile and placement: the option of an offered profile (free, or holding the MIG
    device made for it), else the MIG device there."""
    existing = _existing(gpu)
    holding = {device.gpu_instance for device in gpu.mig_devices}
    offer = _options_wanted(gpu, options)
    devices: list[inventory_pb2.Device] = []
    for profile in gpu.profiles:
        offered = offer and profile.name in options.mig_profiles
        made = [gi for gi in gpu.gpu_instances if gi.profile_id == profile.info.id]
        full = len(made) >= profile.info.instance_count
        for placement in profile.placements:
            here = next((gi for gi in made if gi.placement == placement), None)
            if here is not None and offered and (here.id in existing or here.id not in holding):
                # The slot as it was allocated: its instance lives and dies with one claim.
                device = mig.partition(whole, profile, placement, counters=counters, on_demand=True)
            elif here is not None and here.id in existing:
                device = mig.existing(
                    whole,
                    profile,
                    placement,
                    existing[here.id],
                    gpu_minor=gpu.minor,
                    counters=counters,
                )
            elif (
                here is None
                and offered
                and not full
                and not any(gi.placement.overlaps(placement) for gi in gpu.gpu_instances)
            ):
                device = mig.partition(whole, profile, placement, counters=counters, on_demand=True)
            else:
                continue
            devices.append(device)
    return devices


def to_scan(reading: Reading, *, options: NvmlOptions) -> Scan:
    """The devices and counter sets of one reading (pure)."""
    groups = _interconnect_groups(reading.gpus)
    devices: list[inventory_pb2.Device] = []
    counter_sets: list[inventory_pb2.CounterSet] = []
    for gpu in reading.gpus:
        whole = _gpu_device(gpu, reading=reading, options=options, groups=groups)
        if not gpu.profiles or not (_options_wanted(gpu, options) or gpu.mig_devices):
            devices.append(whole)
            continue
        counters = mig.counter_set(whole.name, gpu.profiles)
        whole.consumes_counters.append(mig.whole_device_consumption(counters))
        devices += [whole, *_slots(whole, gpu, options, counters)]
        counter_sets.append(counters)
    # The whole GPUs only, after their MIG devices copied their attributes.
    for gpu, whole in zip(reading.gpus, (d for d in devices if d.kind == "gpu"), strict=True):
        if gpu.vfio is not None:
            vfio_attributes(whole.attributes, bus_id=gpu.bus_id, viability=gpu.vfio)
    return Scan(devices=tuple(devices), shared_counters=tuple(counter_sets))


class NvmlBackend:
    """A `DeviceBackend` over an (initialised) `NVMLLibrary`."""

    name = "nvml"

    def __init__(
        self,
        library: NVMLLibrary,
        *,
        options: NvmlOptions | None = None,
        sysfs: Sysfs | None = None,
    ) -> None:
        self.changed = asyncio.Event()
        self.library = library
        self.options = options or NvmlOptions()
        self.sysfs = sysfs or Sysfs()
        self._pending: asyncio.Future[Reading] | None = None
        self._missing_profiles: frozenset[str] = frozenset()

    @classmethod
    def open(
        cls, library: NVMLLibrary, *, options: NvmlOptions | None = None, sysfs: Sysfs | None = None
    ) -> NvmlBackend:
        """Initialise NVML; BackendLoadError when there is no driver or library."""
        try:
            library.init()
        except NVMLCallError as exc:
            raise BackendLoadError(f"NVML is not available: {exc}", backend=cls.name) from exc
        return cls(library, options=options, sysfs=sysfs)

    def close(self) -> None:
        """Release NVML (best effort)."""
        try:
            self.library.shutdown()
        except NVMLCallError as exc:
            log.warning("nvml_shutdown_failed", error=str(exc))

    async def scan(self) -> Scan:
        reading = await self._read()
        self._report_missing_profiles(reading)
        return to_scan(reading, options=self.options)

    async def _read(self) -> Reading:
        if self._pending is not None and not self._pending.done():
            raise BackendUnavailableError(
                "NVML: an earlier scan is still blocked in the driver", backend=self.name
            )
        pending = asyncio.ensure_future(
            asyncio.to_thread(
                read, self.library, sysfs=self.sysfs, with_profiles=bool(self.options.mig_profiles)
            )
        )
        pending.add_done_callback(_consume_result)
        self._pending = pending
        try:
            async with asyncio.timeout(self.options.timeout_s):
                return await asyncio.shield(pending)
        except TimeoutError as exc:
            raise BackendUnavailableError(
                f"NVML: scan took longer than {self.options.timeout_s}s", backend=self.name
            ) from exc
        except (NVMLCallError, ValueError) as exc:
            raise BackendUnavailableError(f"NVML: {exc}", backend=self.name) from exc

    def _report_missing_profiles(self, reading: Reading) -> None:
        known = {p.name for gpu in reading.gpus for p in gpu.profiles}
        missing = frozenset(self.options.mig_profiles) - known if reading.gpus else frozenset()
        if missing and missing != self._missing_profiles:
            log.warning("mig_profiles_unknown", profiles=sorted(missing), known=sorted(known))
        self._missing_profiles = missing

    async def watch(self) -> None:
        """Eternal: NVML has no hot-plug events; ask for a rescan every `poll_s`."""
        while True:
            await asyncio.sleep(self.options.poll_s)
            self.changed.set()


def _consume_result(future: asyncio.Future[Reading]) -> None:
    """Retrieve the outcome of a read nobody waits for any more (it timed out)."""
    if not future.cancelled():
        future.exception()
