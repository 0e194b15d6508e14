"""A fake of the MIG partition manager's NVML seam (`shared/vendors/nvidia/mig_nvml.py`).

GPUs, GI profiles and placements are those of `tests/fakes/nvml.py` (docs/hardware.md §1.1/1.2).
GPU instances take memory slices as NVML does: a placement that overlaps a GI, or a profile
at its instance limit, answers INSUFFICIENT_RESOURCES; a GI with a CI cannot be destroyed
(IN_USE). Each GI and CI gets its capability file under `capabilities_root`, numbered as
`/proc/driver/nvidia-caps/mig-minors` numbers them, like the driver's
`/proc/driver/nvidia/capabilities`. Failures are injected per call name (`fail`), and
`crash_after` raises `Crash` (a BaseException, as a kill -9 ends the process) just after the
named call succeeded, and `release` wedges every call until it is set. `calls` counts every
call by name.

The instances are those of the inner `FakeNVML` (`nvml=` shares one with discovery's backend,
so a scan sees what this fake made). With `state=` they are also kept in a JSON file, written
after every change and read at construction: the hardware outlives an agent killed with -9,
and a restarted agent process (a new fake) finds what the killed one made.
"""

from __future__ import annotations

import collections
import json
import threading
import uuid
from pathlib import Path
from typing import Any

from shared.nvml import (
    ERROR_INVALID_ARGUMENT,
    ERROR_NOT_FOUND,
    ERROR_NOT_SUPPORTED,
    Handle,
    NVMLCallError,
)
from shared.vendors.nvidia import naming
from shared.vendors.nvidia.mig import GpuInstance, GpuInstanceProfile, Placement
from shared.vendors.nvidia.mig_nvml import (
    ERROR_IN_USE,
    ERROR_INSUFFICIENT_RESOURCES,
    ComputeInstanceProfile,
)
from tests.fakes.nvml import FakeGpu, FakeGpuInstance, FakeNVML

__all__ = ["Crash", "FakeMigNVML", "cap_minor", "read_state"]

# CI profile enum -> compute slices; enum 7 (1_SLICE_REV1) is the shared-slice variant.
_CI_SLICES = {0: 1, 1: 2, 2: 3, 3: 4, 4: 7, 7: 1}


class Crash(BaseException):
    """The process "died" here (injected)."""


def cap_minor(gpu_minor: int, gi: int, ci: int | None = None) -> int:
    """The capability minor of a GI (or of a CI in it), as the driver numbers them."""
    if ci is None:
        return naming.gpu_instance_cap(gpu_minor, gi)
    return naming.compute_instance_cap(gpu_minor, gi, ci)


def _encode(instances: dict[int, dict[int, FakeGpuInstance]]) -> dict[str, Any]:
    return {
        str(index): [
            {
                "id": gi.id,
                "profileId": gi.profile_id,
                "placement": [gi.placement.start, gi.placement.size],
                "slices": gi.slices,
                "cis": {str(ci): slices for ci, slices in gi.cis.items()},
                "uuids": {str(ci): mig for ci, mig in gi.uuids.items()},
            }
            for _, gi in sorted(by_id.items())
        ]
        for index, by_id in instances.items()
    }


def read_state(path: Path) -> dict[int, dict[int, FakeGpuInstance]]:
    """The instances a `FakeMigNVML(state=path)` left (GPU index -> GI id -> GI); none: {}."""
    if not path.exists():
        return {}
    found: dict[int, dict[int, FakeGpuInstance]] = {}
    for index, instances in json.loads(path.read_text()).items():
        found[int(index)] = {
            int(raw["id"]): FakeGpuInstance(
                id=int(raw["id"]),
                profile_id=int(raw["profileId"]),
                placement=Placement(*raw["placement"]),
                slices=int(raw["slices"]),
                cis={int(ci): int(slices) for ci, slices in raw["cis"].items()},
                uuids={int(ci): str(mig) for ci, mig in raw["uuids"].items()},
            )
            for raw in instances
        }
    return found


class FakeMigNVML:
    """A `MigLibrary`; handles are the `FakeGpu` objects of an inner `FakeNVML`."""

    def __init__(
        self,
        model: str = "H100-80GB",
        *,
        count: int = 2,
        mig_enabled: bool = True,
        capabilities_root: Path | None = None,
        nvml: FakeNVML | None = None,
        state: Path | None = None,
    ) -> None:
        """`nvml`: the node's GPUs and instances (shared with discovery's fake); None: a new
        node of `count` GPUs of `model`. `state`: the JSON file that keeps the instances."""
        if nvml is None:
            nvml = FakeNVML.node(model, count=count, nvlink="none", mig_enabled=mig_enabled)
        self.inner = nvml
        self.inner.initialised = True
        self.gpus = self.inner.gpus
        self.capabilities_root = capabilities_root
        self.state = state
        self.instances: dict[int, dict[int, FakeGpuInstance]] = self.inner.instances
        """GPU index -> GI id -> GI (the inner fake's own dict)."""
        if state is not None:
            self.instances.update(read_state(state))
        self.initialised = False
        self.init_error: NVMLCallError | None = None
        self.fail: dict[str, NVMLCallError] = {}
        self.crash_after: str | None = None
        self.release: threading.Event | None = None
        """When set to an unset Event, every call blocks until it is set (a wedged driver)."""
        self.calls: collections.Counter[str] = collections.Counter()

    def _enter(self, call: str) -> None:
        self.calls[call] += 1
        if self.release is not None:
            self.release.wait(timeout=30)
        if call in self.fail:
            raise self.fail[call]

    def _leave(self, call: str) -> None:
        if self.state is not None:
            self.state.write_text(json.dumps(_encode(self.instances)))
        if self.crash_after == call:
            self.crash_after = None
            raise Crash(call)

    def _gpu(self, handle: Handle, call: str) -> FakeGpu:
        self._enter(call)
        if not self.initialised:
            raise NVMLCallError(call, code=1, message="Uninitialized")
        assert isinstance(handle, FakeGpu)
        return handle

    def _gi(self, handle: Handle, gi: int, call: str) -> tuple[FakeGpu, FakeGpuInstance]:
        gpu = self._gpu(handle, call)
        found = self.instances[gpu.index].get(gi)
        if found is None:
            raise NVMLCallError(call, code=ERROR_NOT_FOUND, message="Not Found")
        return gpu, found

    def _access(self, gpu: FakeGpu, gi: int, ci: int | None = None) -> Path | None:
        if self.capabilities_root is None:
            return None
        path = self.capabilities_root / f"gpu{gpu.index}" / "mig" / f"gi{gi}"
        return (path / f"ci{ci}" if ci is not None else path) / "access"

    def _write_access(self, gpu: FakeGpu, gi: int, ci: int | None = None) -> None:
        path = self._access(gpu, gi, ci)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            minor = cap_minor(gpu.index, gi, ci)
            path.write_text(f"DeviceFileMinor: {minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n")

    def _remove_access(self, gpu: FakeGpu, gi: int, ci: int | None = None) -> None:
        path = self._access(gpu, gi, ci)
        if path is not None:
            path.unlink(missing_ok=True)

    def init(self) -> None:
        self._enter("init")
        if self.init_error is not None:
            raise self.init_error
        self.initialised = True

    def handle_by_uuid(self, uuid: str) -> Handle:
        self._enter("handle_by_uuid")
        for gpu in self.gpus:
            if gpu.uuid == uuid:
                return gpu
        raise NVMLCallError("handle_by_uuid", code=ERROR_NOT_FOUND, message="Not Found")

    def minor_number(self, handle: Handle) -> int:
        return self._gpu(handle, "minor_number").index

    def mig_mode(self, handle: Handle) -> tuple[int, int]:
        self._gpu(handle, "mig_mode")
        return self.inner.mig_mode(handle)

    def gpu_instance_profile(self, handle: Handle, enum: int) -> GpuInstanceProfile:
        self._gpu(handle, "gpu_instance_profile")
        return self.inner.gpu_instance_profile(handle, enum)

    def _profile(self, gpu: FakeGpu, profile_id: int) -> GpuInstanceProfile:
        for enum in range(0x12):
            try:
                info = self.inner.gpu_instance_profile(gpu, enum)
            except NVMLCallError:
                continue
            if info.id == profile_id:
                return info
        raise NVMLCallError("profile", code=ERROR_INVALID_ARGUMENT, message="Invalid Argument")

    def gpu_instance_placements(self, handle: Handle, profile_id: int) -> tuple[Placement, ...]:
        self._gpu(handle, "gpu_instance_placements")
        return tuple(
            Placement(p.start, p.size)
            for p in self.inner.gpu_instance_placements(handle, profile_id)
        )

    def gpu_instances(self, handle: Handle, profile_id: int) -> tuple[GpuInstance, ...]:
        gpu = self._gpu(handle, "gpu_instances")
        self._profile(gpu, profile_id)
        return tuple(
            GpuInstance(id=gi.id, profile_id=gi.profile_id, placement=gi.placement)
            for gi in self.instances[gpu.index].values()
            if gi.profile_id == profile_id
        )

    def create_gpu_instance(
        self, handle: Handle, profile_id: int, placement: Placement
    ) -> GpuInstance:
        call = "create_gpu_instance"
        gpu = self._gpu(handle, call)
        if gpu.mig_mode[0] != 1:
            raise NVMLCallError(call, code=ERROR_NOT_SUPPORTED, message="Not Supported")
        info = self._profile(gpu, profile_id)
        valid = self.inner.gpu_instance_placements(gpu, profile_id)
        if (placement.start, placement.size) not in {(p.start, p.size) for p in valid}:
            raise NVMLCallError(call, code=ERROR_INVALID_ARGUMENT, message="Invalid Argument")
        existing = self.instances[gpu.index]
        same = sum(1 for gi in existing.values() if gi.profile_id == profile_id)
        overlap = any(gi.placement.overlaps(placement) for gi in existing.values())
        if overlap or same >= info.instance_count:
            raise NVMLCallError(
                call, code=ERROR_INSUFFICIENT_RESOURCES, message="Insufficient Resources"
            )
        gi_id = min(set(range(1, 15)) - set(existing))
        existing[gi_id] = FakeGpuInstance(gi_id, profile_id, placement, info.slice_count)
        self._write_access(gpu, gi_id)
        self._leave(call)
        return GpuInstance(id=gi_id, profile_id=profile_id, placement=placement)

    def destroy_gpu_instance(self, handle: Handle, gpu_instance: int) -> None:
        gpu, gi = self._gi(handle, gpu_instance, "destroy_gpu_instance")
        if gi.cis:
            raise NVMLCallError("destroy_gpu_instance", code=ERROR_IN_USE, message="In use")
        del self.instances[gpu.index][gi.id]
        self._remove_access(gpu, gi.id)
        self._leave("destroy_gpu_instance")

    def compute_instance_profile(
        self, handle: Handle, gpu_instance: int, enum: int
    ) -> ComputeInstanceProfile:
        _, gi = self._gi(handle, gpu_instance, "compute_instance_profile")
        slices = _CI_SLICES.get(enum)
        if slices is None or slices > gi.slices:
            raise NVMLCallError(
                "compute_instance_profile", code=ERROR_NOT_SUPPORTED, message="Not Supported"
            )
        return ComputeInstanceProfile(id=enum, slice_count=slices)

    def compute_instances(
        self, handle: Handle, gpu_instance: int, profile_id: int
    ) -> tuple[int, ...]:
        _, gi = self._gi(handle, gpu_instance, "compute_instances")
        slices = _CI_SLICES.get(profile_id)
        return tuple(ci for ci, used in gi.cis.items() if used == slices)

    def create_compute_instance(self, handle: Handle, gpu_instance: int, profile_id: int) -> int:
        call = "create_compute_instance"
        gpu, gi = self._gi(handle, gpu_instance, call)
        slices = _CI_SLICES.get(profile_id)
        if slices is None or slices > gi.slices:
            raise NVMLCallError(call, code=ERROR_INVALID_ARGUMENT, message="Invalid Argument")
        if sum(gi.cis.values()) + slices > gi.slices:
            raise NVMLCallError(
                call, code=ERROR_INSUFFICIENT_RESOURCES, message="Insufficient Resources"
            )
        ci = min(set(range(8)) - set(gi.cis))
        gi.cis[ci] = slices
        gi.uuids[ci] = naming.mig_uuid(str(uuid.uuid4()))
        self._write_access(gpu, gi.id, ci)
        self._leave(call)
        return ci

    def destroy_compute_instance(
        self, handle: Handle, gpu_instance: int, compute_instance: int
    ) -> None:
        call = "destroy_compute_instance"
        gpu, gi = self._gi(handle, gpu_instance, call)
        if compute_instance not in gi.cis:
            raise NVMLCallError(call, code=ERROR_NOT_FOUND, message="Not Found")
        del gi.cis[compute_instance]
        del gi.uuids[compute_instance]
        self._remove_access(gpu, gi.id, compute_instance)
        self._leave(call)

    def mig_device_uuid(self, handle: Handle, gpu_instance: int, compute_instance: int) -> str:
        call = "mig_device_uuid"
        _, gi = self._gi(handle, gpu_instance, call)
        if compute_instance not in gi.uuids:
            raise NVMLCallError(call, code=ERROR_NOT_FOUND, message="Not Found")
        return gi.uuids[compute_instance]

    # Test helpers (not part of the seam).

    def admin_gpu_instance(self, index: int, profile_id: int, start: int) -> int:
        """A GI made behind the manager's back (by an admin, with nvidia-smi): its id."""
        size = next(
            p.size
            for p in self.inner.gpu_instance_placements(self.gpus[index], profile_id)
            if p.start == start
        )
        was, self.initialised = self.initialised, True
        try:
            return self.create_gpu_instance(self.gpus[index], profile_id, Placement(start, size)).id
        finally:
            self.initialised = was

    def gpu_instances_of(self, index: int) -> list[tuple[int, Placement, int]]:
        """(GI id, placement, number of CIs) of every GI on GPU `index`, by GI id."""
        return [
            (gi.id, gi.placement, len(gi.cis)) for _, gi in sorted(self.instances[index].items())
        ]
