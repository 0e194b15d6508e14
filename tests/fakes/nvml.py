"""A fake NVML that answers like a real A100, H100, H200 (or a MIG-less L4) node.

Profile data is docs/hardware.md §1.1/1.2: GI profile ids, placements, SMs, engines and memory per
GPU model. NVLink is modelled as HGX boards (every GPU linked to the same 4 NVSwitches),
bridged pairs, or none. Failures are injected per call name (`fail`), at init (`init_error`),
or by blocking every call until `release` is set (a wedged driver).

MIG instances that exist live in `instances` (GPU index -> GI id -> `FakeGpuInstance`): the
MIG partition manager's fake (`tests/fakes/nvml_mig.py`) makes and destroys them in the same
dict when it is given this fake, so discovery sees what the allocation agent made; an admin's
are made with `make_mig_device`.
"""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from shared.nvml import ERROR_INVALID_ARGUMENT, ERROR_NOT_SUPPORTED, Handle, NVMLCallError
from shared.vendors.nvidia.mig import GpuInstance, GpuInstanceProfile, MigDevice, Placement
from shared.vendors.parts.sysfs import normalize_bus_id
from tests.fakes.sysfs import add_pci_device

__all__ = [
    "MODELS",
    "FakeGpu",
    "FakeGpuInstance",
    "FakeNVML",
    "GpuModel",
    "not_supported",
]

# GI profile id -> (NVML enum, placements (starts, size)).
_GEOMETRY: dict[int, tuple[int, tuple[int, ...], int]] = {
    19: (0x0, (0, 1, 2, 3, 4, 5, 6), 1),
    20: (0x7, (0, 1, 2, 3, 4, 5, 6), 1),
    15: (0x9, (0, 2, 4, 6), 2),
    14: (0x1, (0, 2, 4), 2),
    9: (0x2, (0, 4), 4),
    5: (0x3, (0,), 4),
    0: (0x4, (0,), 8),
}
# Profile ids in table order, and per id: (compute slices, max instances).
_IDS = (19, 20, 15, 14, 9, 5, 0)
_SLICES = {19: (1, 7), 20: (1, 1), 15: (1, 4), 14: (2, 3), 9: (3, 2), 5: (4, 1), 0: (7, 1)}


@dataclass(frozen=True, slots=True)
class GpuModel:
    product_name: str
    architecture: int
    compute_capability: tuple[int, int]
    memory_mib: int
    names: tuple[str, ...] = ()
    """Profile names in `_IDS` order; empty: no MIG."""
    memory_gib: tuple[float, ...] = ()
    sms: tuple[int, ...] = ()
    # (decoders, encoders, copy engines, jpeg, ofa) per profile, in `_IDS` order.
    engines: tuple[tuple[int, int, int, int, int], ...] = ()

    def profile(self, profile_id: int) -> GpuInstanceProfile:
        k = _IDS.index(profile_id)
        decoders, encoders, copy_engines, jpeg, ofa = self.engines[k]
        slices, instances = _SLICES[profile_id]
        return GpuInstanceProfile(
            id=profile_id,
            name=f"MIG {self.names[k]}",
            slice_count=slices,
            instance_count=instances,
            multiprocessors=self.sms[k],
            copy_engines=copy_engines,
            decoders=decoders,
            encoders=encoders,
            jpeg_engines=jpeg,
            ofa_engines=ofa,
            memory_mib=int(self.memory_gib[k] * 1024),
        )


_GH100_ENGINES = (
    (1, 0, 1, 1, 0),
    (1, 0, 1, 1, 1),
    (1, 0, 1, 1, 0),
    (2, 0, 2, 2, 0),
    (3, 0, 3, 3, 0),
    (4, 0, 4, 4, 0),
    (7, 0, 8, 7, 1),
)
_GH100_SMS = (16, 16, 26, 32, 60, 64, 132)

MODELS: dict[str, GpuModel] = {
    "A100-80GB": GpuModel(
        product_name="NVIDIA A100-SXM4-80GB",
        architecture=7,
        compute_capability=(8, 0),
        memory_mib=81920,
        names=("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
        memory_gib=(9.5, 9.5, 19.5, 19.5, 39.5, 39.5, 79.25),
        sms=(14, 14, 14, 28, 42, 56, 98),
        engines=(
            (0, 0, 1, 0, 0),
            (1, 0, 1, 1, 1),
            (1, 0, 1, 0, 0),
            (1, 0, 2, 0, 0),
            (2, 0, 3, 0, 0),
            (2, 0, 4, 0, 0),
            (5, 0, 7, 1, 1),
        ),
    ),
    "H100-80GB": GpuModel(
        product_name="NVIDIA H100 80GB HBM3",
        architecture=9,
        compute_capability=(9, 0),
        memory_mib=81559,
        names=("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
        memory_gib=(9.75, 9.75, 19.625, 19.625, 39.5, 39.5, 79.25),
        sms=_GH100_SMS,
        engines=_GH100_ENGINES,
    ),
    "H200-141GB": GpuModel(
        product_name="NVIDIA H200",
        architecture=9,
        compute_capability=(9, 0),
        memory_mib=143771,
        names=("1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"),
        memory_gib=(16.0, 16.0, 32.25, 32.25, 69.5, 69.5, 139.75),
        sms=_GH100_SMS,
        engines=_GH100_ENGINES,
    ),
    "L4": GpuModel(
        product_name="NVIDIA L4",
        architecture=8,
        compute_capability=(8, 9),
        memory_mib=23034,
    ),
}
_HGX_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
_NVSWITCHES = ("00000000:05:00.0", "00000000:06:00.0", "00000000:07:00.0", "00000000:08:00.0")


def not_supported(call: str) -> NVMLCallError:
    return NVMLCallError(call, code=ERROR_NOT_SUPPORTED, message="Not Supported")


@dataclass(slots=True)
class FakeGpuInstance:
    """A GPU instance that exists, and its compute instances."""

    id: int
    profile_id: int
    placement: Placement
    slices: int
    cis: dict[int, int] = field(default_factory=dict)
    """CI id -> its compute slices."""
    uuids: dict[int, str] = field(default_factory=dict)
    """CI id -> MIG device UUID."""


@dataclass(slots=True)
class FakeGpu:
    index: int
    model: GpuModel
    bus_id: str
    uuid: str
    mig_mode: tuple[int, int] = (0, 0)
    nvlinks: dict[int, str] = field(default_factory=dict)
    """Active link number -> remote bus id."""


class FakeNVML:
    """An `NVMLLibrary`; handles are the `FakeGpu` objects."""

    def __init__(
        self, gpus: list[FakeGpu], *, driver: str = "550.54.15", cuda: int = 12040
    ) -> None:
        self.gpus = gpus
        self.driver = driver
        self.cuda = cuda
        self.initialised = False
        self.init_error: NVMLCallError | None = None
        self.fail: dict[str, NVMLCallError] = {}
        self.release: threading.Event | None = None
        """When set to an unset Event, every call blocks until it is set."""
        self.calls = 0
        self.instances: dict[int, dict[int, FakeGpuInstance]] = {gpu.index: {} for gpu in gpus}
        """GPU index -> GI id -> the GPU instances that exist."""

    @classmethod
    def node(
        cls,
        model: str = "H100-80GB",
        *,
        count: int = 8,
        nvlink: Literal["nvswitch", "pairs", "none"] = "nvswitch",
        mig_enabled: bool = False,
    ) -> FakeNVML:
        gpus = []
        for i in range(count):
            gpu = FakeGpu(
                index=i,
                model=MODELS[model],
                bus_id=f"00000000:{_HGX_BUSES[i % len(_HGX_BUSES)] + i // 8:02X}:00.0",
                uuid=f"GPU-{i:08x}-1111-2222-3333-{0x4444 + i:012x}",
                mig_mode=(1, 1) if mig_enabled else (0, 0),
            )
            gpus.append(gpu)
        for gpu in gpus:
            if nvlink == "nvswitch":
                gpu.nvlinks = {link: _NVSWITCHES[link % 4] for link in range(18)}
            elif nvlink == "pairs":
                peer = gpus[gpu.index ^ 1] if gpu.index ^ 1 < len(gpus) else None
                gpu.nvlinks = {link: peer.bus_id for link in range(4)} if peer else {}
        return cls(gpus)

    def populate_sysfs(self, root: Path) -> dict[str, tuple[str, int]]:
        """The GPUs in a fake sysfs tree: bus id -> (PCIe root, NUMA node) as created.

        Each GPU sits under root complex `pci0000:<bus rounded down to 0x10>`; the first half
        of the GPUs is on NUMA node 0, the rest on node 1.
        """
        created = {}
        for gpu in self.gpus:
            bdf = normalize_bus_id(gpu.bus_id)
            bus = int(bdf.split(":")[1], 16)
            pcie_root = f"pci0000:{bus & 0xF0:02x}"
            numa = 0 if gpu.index < len(self.gpus) / 2 else 1
            add_pci_device(root, bdf, pcie_root=pcie_root, numa_node=numa)
            created[bdf] = (pcie_root, numa)
        return created

    def _enter(self, call: str) -> None:
        self.calls += 1
        if self.release is not None:
            self.release.wait(timeout=30)
        if call in self.fail:
            raise self.fail[call]

    def _gpu(self, handle: Handle, call: str) -> FakeGpu:
        self._enter(call)
        if not self.initialised:
            raise NVMLCallError(call, code=1, message="Uninitialized")
        assert isinstance(handle, FakeGpu)
        return handle

    def init(self) -> None:
        if self.init_error is not None:
            raise self.init_error
        self.initialised = True

    def shutdown(self) -> None:
        self.initialised = False

    def driver_version(self) -> str:
        self._enter("driver_version")
        return self.driver

    def cuda_driver_version(self) -> int:
        self._enter("cuda_driver_version")
        return self.cuda

    def device_count(self) -> int:
        self._enter("device_count")
        return len(self.gpus)

    def handle_by_index(self, index: int) -> Handle:
        self._enter("handle_by_index")
        return self.gpus[index]

    def uuid(self, handle: Handle) -> str:
        return self._gpu(handle, "uuid").uuid

    def name(self, handle: Handle) -> str:
        return self._gpu(handle, "name").model.product_name

    def minor_number(self, handle: Handle) -> int:
        return self._gpu(handle, "minor_number").index

    def architecture(self, handle: Handle) -> int:
        return self._gpu(handle, "architecture").model.architecture

    def cuda_compute_capability(self, handle: Handle) -> tuple[int, int]:
        return self._gpu(handle, "cuda_compute_capability").model.compute_capability

    def memory_total(self, handle: Handle) -> int:
        return self._gpu(handle, "memory_total").model.memory_mib << 20

    def pci_bus_id(self, handle: Handle) -> str:
        return self._gpu(handle, "pci_bus_id").bus_id

    def mig_mode(self, handle: Handle) -> tuple[int, int]:
        gpu = self._gpu(handle, "mig_mode")
        if not gpu.model.names:
            raise not_supported("mig_mode")
        return gpu.mig_mode

    def gpu_instance_profile(self, handle: Handle, profile: int) -> GpuInstanceProfile:
        gpu = self._gpu(handle, "gpu_instance_profile")
        by_enum = {enum: pid for pid, (enum, _, _) in _GEOMETRY.items()}
        if not gpu.model.names or profile not in by_enum:
            raise NVMLCallError("gpu_instance_profile", code=ERROR_INVALID_ARGUMENT, message="x")
        return gpu.model.profile(by_enum[profile])

    def gpu_instance_placements(self, handle: Handle, profile_id: int) -> tuple[Placement, ...]:
        gpu = self._gpu(handle, "gpu_instance_placements")
        if not gpu.model.names or profile_id not in _GEOMETRY:
            raise not_supported("gpu_instance_placements")
        _, starts, size = _GEOMETRY[profile_id]
        return tuple(Placement(start, size) for start in starts)

    def nvlink_active(self, handle: Handle, link: int) -> bool:
        gpu = self._gpu(handle, "nvlink_active")
        if not gpu.nvlinks:
            raise not_supported("nvlink_active")
        if link >= 18:
            raise NVMLCallError("nvlink_active", code=ERROR_INVALID_ARGUMENT, message="x")
        return link in gpu.nvlinks

    def nvlink_remote_bus_id(self, handle: Handle, link: int) -> str:
        gpu = self._gpu(handle, "nvlink_remote_bus_id")
        if link not in gpu.nvlinks:
            raise not_supported("nvlink_remote_bus_id")
        return gpu.nvlinks[link]

    def gpu_instances(self, handle: Handle, profile_id: int) -> tuple[GpuInstance, ...]:
        gpu = self._gpu(handle, "gpu_instances")
        if gpu.mig_mode[0] != 1 or profile_id not in _GEOMETRY:
            raise not_supported("gpu_instances")
        return tuple(
            GpuInstance(id=gi.id, profile_id=gi.profile_id, placement=gi.placement)
            for _, gi in sorted(self.instances[gpu.index].items())
            if gi.profile_id == profile_id
        )

    def mig_devices(self, handle: Handle) -> tuple[MigDevice, ...]:
        gpu = self._gpu(handle, "mig_devices")
        if gpu.mig_mode[0] != 1:
            raise not_supported("mig_devices")
        return tuple(
            MigDevice(uuid=gi.uuids[ci], gpu_instance=gi.id, compute_instance=ci)
            for _, gi in sorted(self.instances[gpu.index].items())
            for ci in sorted(gi.cis)
        )

    # Test helpers (not part of the seam).

    def make_mig_device(self, index: int, profile_id: int, start: int) -> MigDevice:
        """A MIG device made behind the driver's back (by an admin, with nvidia-smi): a GI of
        the profile at `start` with one compute instance of its full size."""
        gpu = self.gpus[index]
        _, starts, size = _GEOMETRY[profile_id]
        placement = Placement(start, size)
        existing = self.instances[gpu.index]
        assert start in starts, f"{start} is not a placement of profile {profile_id}"
        assert not any(gi.placement.overlaps(placement) for gi in existing.values())
        gi_id = min(set(range(1, 15)) - set(existing))
        slices = _SLICES[profile_id][0]
        mig = f"MIG-{uuid.uuid4()}"
        existing[gi_id] = FakeGpuInstance(
            gi_id, profile_id, placement, slices, cis={0: slices}, uuids={0: mig}
        )
        return MigDevice(uuid=mig, gpu_instance=gi_id, compute_instance=0)
