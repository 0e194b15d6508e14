"""The sim backend: devices from a sim profile, with hot-plug for development and tests.

Hot-plug comes two ways: the profile file is re-read when it changes on disk (polled), and
tests call `add_device` / `remove_device` / `set_attribute`. A reload replaces the whole device
set, in-process changes included. An unreadable profile after start is logged and ignored.

A device with `mig_profiles` is an H100-80GB in MIG terms: its counter set and partitions come
from `mig` over the H100 geometry (`shared.vendors.nvidia.mig.H100_80GB`, docs/hardware.md
§1.1/1.2), exactly as the nvml backend builds them. No sim MIG device exists before a claim
is prepared (the allocation agent's sim partition manager makes it then), so every placement
is flagged `createdOnDemand`. A device with `shared` capacity lists it in
`Device.shared_capacity`.

With a sim sysfs tree (`sysfs`, the discovery agent's `--sysfs-root` when it is not `/sys`: sim
devices are never real), a device whose profile gives it a `resource.kubernetes.io/pciBusID`
also gets `iommuGroup` and `vfioViable` from the tree, as the hardware backends do
(docs/vfio.md).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from pathlib import Path

import structlog

from shared.errors import BackendUnavailableError, ConfigError
from shared.pb.drasuite.v1 import inventory_pb2
from shared.sim import profile
from shared.sim.profile import AttributeValue, SimDevice, VersionValue
from shared.vendors.nvidia import mig_devices as mig
from shared.vendors.nvidia.mig import H100_80GB
from shared.vendors.parts.discovery import Scan
from shared.vendors.parts.sysfs import PCI_BUS_ID, Sysfs, vfio_attributes

__all__ = ["H100_MIG", "SimBackend", "attribute_value", "to_device", "to_devices"]

log = structlog.get_logger(__name__)

_FileStamp = tuple[int, int, int]

H100_MIG = H100_80GB
"""Every MIG profile of an H100-80GB, with its placements (what NVML would report)."""


def attribute_value(value: AttributeValue) -> inventory_pb2.AttributeValue:
    """A sim attribute as the typed proto value (bool before int: bool is an int in Python)."""
    if isinstance(value, bool):
        return inventory_pb2.AttributeValue(bool=value)
    if isinstance(value, int):
        return inventory_pb2.AttributeValue(int=value)
    if isinstance(value, VersionValue):
        return inventory_pb2.AttributeValue(version=value.version)
    return inventory_pb2.AttributeValue(string=value)


def to_device(sim: SimDevice) -> inventory_pb2.Device:
    """One sim device as an inventory device; attribute names stay as the profile has them."""
    device = inventory_pb2.Device(
        name=sim.name,
        kind=sim.kind,
        uuid=sim.uuid,
        capacity=dict(sim.capacity),
        env=dict(sim.env),
        device_nodes=[
            inventory_pb2.DeviceNode(path=node.path, host_path=node.host_path)
            for node in sim.device_nodes
        ],
    )
    for key, value in sim.attributes.items():
        device.attributes[key].CopyFrom(attribute_value(value))
    device.shared_capacity.update(sim.shared)
    return device


def to_devices(
    sim: SimDevice,
) -> tuple[list[inventory_pb2.Device], inventory_pb2.CounterSet | None]:
    """The device, and with MIG profiles its partitions and the counter set they share."""
    whole = to_device(sim)
    if not sim.mig_profiles:
        return [whole], None
    counters = mig.counter_set(whole.name, H100_MIG)
    whole.consumes_counters.append(mig.whole_device_consumption(counters))
    devices = [whole]
    for wanted in H100_MIG:
        if wanted.name in sim.mig_profiles:
            devices += [
                mig.partition(whole, wanted, placement, counters=counters, on_demand=True)
                for placement in wanted.placements
            ]
    return devices, counters


def resolve(name_or_path: str) -> Path:
    """The file of a profile: a shipped profile by name, else the path as given."""
    shipped = profile.PROFILES_DIR / f"{name_or_path}.yaml"
    path = Path(name_or_path)
    return shipped if not path.suffix and shipped.exists() else path


def _stamp(path: Path) -> _FileStamp | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return (stat.st_mtime_ns, stat.st_size, stat.st_ino)


class SimBackend:
    """A `DeviceBackend` over a sim profile."""

    name = "sim"

    def __init__(
        self,
        devices: list[SimDevice],
        *,
        path: Path | None = None,
        poll_s: float = 0.5,
        sysfs: Sysfs | None = None,
    ) -> None:
        self.changed = asyncio.Event()
        self.path = path
        self.poll_s = poll_s
        self._devices = {device.name: device for device in devices}
        self._stamp = _stamp(path) if path is not None else None
        self._available = True
        self.sysfs = sysfs

    @classmethod
    def from_profile(
        cls, name_or_path: str, *, poll_s: float = 0.5, sysfs: Sysfs | None = None
    ) -> SimBackend:
        """Load a profile (ConfigError when it is missing or invalid) and follow its file,
        unless it is one the package ships: package data changes only with the package, and
        a fleet of sim nodes would otherwise stat it twice a second each."""
        path = resolve(name_or_path)
        loaded = profile.load(str(path))
        followed = None if path.resolve().parent == profile.PROFILES_DIR.resolve() else path
        return cls(list(loaded.devices), path=followed, poll_s=poll_s, sysfs=sysfs)

    @property
    def devices(self) -> list[SimDevice]:
        return list(self._devices.values())

    async def scan(self) -> Scan:
        if not self._available:
            raise BackendUnavailableError("sim backend: made unavailable", backend=self.name)
        devices: list[inventory_pb2.Device] = []
        counter_sets: list[inventory_pb2.CounterSet] = []
        for sim in self._devices.values():
            found, counters = to_devices(sim)
            whole = found[0]
            if self.sysfs is not None and PCI_BUS_ID in whole.attributes:
                bus_id = whole.attributes[PCI_BUS_ID].string
                vfio = await asyncio.to_thread(self.sysfs.vfio, bus_id)
                vfio_attributes(whole.attributes, bus_id=bus_id, viability=vfio)
            devices += found
            counter_sets += [counters] if counters is not None else []
        return Scan(devices=tuple(devices), shared_counters=tuple(counter_sets))

    async def watch(self) -> None:
        """Eternal: poll the profile file, if one is followed; a changed, valid file replaces
        the device set."""
        path = self.path
        if path is None:
            await asyncio.Event().wait()  # nothing to follow: hot-plugs come through the API
            return
        while True:
            await asyncio.sleep(self.poll_s)
            await self._check_file(path)

    async def _check_file(self, path: Path) -> None:
        # Inline: one stat of a local file costs microseconds, a thread hop many times that.
        stamp = _stamp(path)
        if stamp is None or stamp == self._stamp:
            return
        self._stamp = stamp
        try:
            loaded = await asyncio.to_thread(profile.load, str(path))
        except ConfigError as exc:
            log.warning("sim_profile_reload_failed", path=str(path), error=str(exc))
            return
        self._devices = {device.name: device for device in loaded.devices}
        log.info("sim_profile_reloaded", path=str(path), devices=len(self._devices))
        self.changed.set()

    def add_device(self, device: SimDevice) -> None:
        """Hot-plug a device; ValueError when its name is taken."""
        if device.name in self._devices:
            raise ValueError(f"sim device {device.name} already exists")
        self._devices[device.name] = device
        self.changed.set()

    def remove_device(self, name: str) -> None:
        """Hot-unplug a device; KeyError when there is none of that name."""
        del self._devices[name]
        self.changed.set()

    def set_attribute(self, device: str, key: str, value: AttributeValue | None) -> None:
        """Set (or, with None, remove) one attribute of a device."""
        current = self._devices[device]
        attributes = dict(current.attributes)
        if value is None:
            attributes.pop(key, None)
        else:
            attributes[key] = value
        self._devices[device] = dataclasses.replace(current, attributes=attributes)
        self.changed.set()

    def set_available(self, available: bool) -> None:
        """Make scans fail with BackendUnavailableError (False) or succeed again (True)."""
        self._available = available
        self.changed.set()
