"""MIG geometry (pure): GPU-instance profiles, their placements, instances and MIG devices.

A MIG-capable GPU has 7 compute slices and 8 memory slices; a GPU-instance (GI) profile takes
some of them and may start only at the placements NVML lists for it; GIs never overlap
(docs/hardware.md §1.1, 1.2). A GI holds compute instances (CIs); a (GI, CI) pair is a MIG
device with its own UUID (§2.2). The types here are what the NVML seams of discovery and of the
MIG partition manager return, so both read the same profile, placement and instance.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "COMPUTE_SLICES",
    "H100_80GB",
    "MEMORY_SLICES",
    "GpuInstance",
    "GpuInstanceProfile",
    "MigDevice",
    "MigProfile",
    "Placement",
    "find",
    "is_profile_name",
    "profile_name",
]

COMPUTE_SLICES = 7
MEMORY_SLICES = 8
_PROFILE_NAME = re.compile(r"^(\d+c\.)?\d+g\.\d+gb([+-][a-z0-9]+)*$")


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a GPU instance sits or may sit: memory slices `[start, start+size)` of the 8."""

    start: int
    size: int

    @property
    def end(self) -> int:
        return self.start + self.size

    def overlaps(self, other: Placement) -> bool:
        return self.start < other.end and other.start < self.end


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuInstanceProfile:
    """`nvmlDeviceGetGpuInstanceProfileInfo` (v2) of one MIG GPU-instance profile."""

    id: int
    """The GI profile id (19 = 1g, 0 = 7g, …), not the enum it was asked by."""
    name: str
    """As NVML reports it, e.g. `MIG 1g.10gb`."""
    slice_count: int
    """Compute slices of the 7."""
    instance_count: int
    """How many GIs of this profile the GPU holds at most."""
    multiprocessors: int = 0
    copy_engines: int = 0
    decoders: int = 0
    encoders: int = 0
    jpeg_engines: int = 0
    ofa_engines: int = 0
    memory_mib: int = 0
    """`memorySizeMB`, which is MiB."""

    @property
    def short_name(self) -> str:
        """`MIG 1g.10gb` -> `1g.10gb`."""
        return profile_name(self.name)


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuInstance:
    """`nvmlGpuInstanceGetInfo` of one GI that exists."""

    id: int
    profile_id: int
    placement: Placement


@dataclass(frozen=True, slots=True, kw_only=True)
class MigDevice:
    """One MIG device that exists: a compute instance in a GPU instance, with its UUID."""

    uuid: str
    gpu_instance: int
    compute_instance: int


@dataclass(frozen=True, slots=True)
class MigProfile:
    """A GPU-instance profile of one GPU and where its instances may sit."""

    info: GpuInstanceProfile
    placements: tuple[Placement, ...]

    @property
    def name(self) -> str:
        return self.info.short_name

    @property
    def memory_slices(self) -> int:
        return self.placements[0].size if self.placements else 0

    @property
    def starts(self) -> tuple[int, ...]:
        return tuple(p.start for p in self.placements)

    def placement(self, start: int) -> Placement | None:
        """The placement starting at memory slice `start`, or None when there is none."""
        return next((p for p in self.placements if p.start == start), None)


def profile_name(nvml_name: str) -> str:
    """NVML's `MIG 1g.10gb` -> `1g.10gb` (a name without the prefix is returned as is)."""
    return nvml_name.removeprefix("MIG").strip()


def is_profile_name(name: str) -> bool:
    """Whether `name` is shaped like a MIG profile name (`1g.10gb`, `1g.10gb+me`, `1c.3g.40gb`)."""
    return _PROFILE_NAME.match(name) is not None


def find(
    profiles: Iterable[MigProfile], *, name: str = "", profile_id: int | None = None
) -> MigProfile | None:
    """The profile of that name (`1g.10gb`) or GI profile id, or None."""
    for profile in profiles:
        if (name and profile.name == name) or profile.info.id == profile_id:
            return profile
    return None


# H100-80GB GI profiles (docs/hardware.md §1.1/1.2): id, name, compute slices, max instances,
# placement starts, memory slices, SMs, (decoders, encoders, copy engines, jpeg, ofa), MiB.
_H100_80GB: tuple[
    tuple[int, str, int, int, tuple[int, ...], int, int, tuple[int, ...], int], ...
] = (
    (19, "1g.10gb", 1, 7, (0, 1, 2, 3, 4, 5, 6), 1, 16, (1, 0, 1, 1, 0), 9984),
    (20, "1g.10gb+me", 1, 1, (0, 1, 2, 3, 4, 5, 6), 1, 16, (1, 0, 1, 1, 1), 9984),
    (15, "1g.20gb", 1, 4, (0, 2, 4, 6), 2, 26, (1, 0, 1, 1, 0), 20096),
    (14, "2g.20gb", 2, 3, (0, 2, 4), 2, 32, (2, 0, 2, 2, 0), 20096),
    (9, "3g.40gb", 3, 2, (0, 4), 4, 60, (3, 0, 3, 3, 0), 40448),
    (5, "4g.40gb", 4, 1, (0,), 4, 64, (4, 0, 4, 4, 0), 40448),
    (0, "7g.80gb", 7, 1, (0,), 8, 132, (7, 0, 8, 7, 1), 81152),
)


def _table(
    rows: tuple[tuple[int, str, int, int, tuple[int, ...], int, int, tuple[int, ...], int], ...],
) -> tuple[MigProfile, ...]:
    profiles = []
    for gi, name, slices, instances, starts, size, sms, engines, mib in rows:
        decoders, encoders, copy_engines, jpeg, ofa = engines
        info = GpuInstanceProfile(
            id=gi,
            name=f"MIG {name}",
            slice_count=slices,
            instance_count=instances,
            multiprocessors=sms,
            copy_engines=copy_engines,
            decoders=decoders,
            encoders=encoders,
            jpeg_engines=jpeg,
            ofa_engines=ofa,
            memory_mib=mib,
        )
        profiles.append(MigProfile(info, tuple(Placement(s, size) for s in starts)))
    return tuple(profiles)


H100_80GB = _table(_H100_80GB)
"""Every MIG profile of an H100-80GB with its placements, as NVML reports them (the sim's GPUs)."""
