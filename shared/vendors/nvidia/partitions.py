"""The nvml backend's partition manager: MIG devices made through NVML at prepare time.

A partition of a GPU is a GPU instance (GI) of the profile, placed on free memory slices,
with one compute instance (CI) of the GI's full size; the container sees it as
`NVIDIA_VISIBLE_DEVICES=MIG-<uuid>` with the parent's `/dev/nvidia<minor>` and the GI's and
CI's `/dev/nvidia-caps/nvidia-cap<N>` nodes, N read from the driver's
`/proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<gi>[/ci<ci>]/access` (`DeviceFileMinor`).
A partition asked for at a `placement` (an option made on demand, made on its parent) is made
there. A device of kind `mig` (a MIG slot discovery publishes) stands for its parent at its own
`placementStart`: it is recorded and found as the parent's partition at that placement, so a
retried prepare finds the partition made for the claim whichever way the slot is published.

Crash safety: an entry naming (claim, device) -> (GPU UUID, GI profile, placement) is written
to `mig-partitions.json` *before* the GI is made, and its GI and CI ids after each is made. A
retry finds the entry and completes it: it adopts the GI at the recorded placement, or the CI
inside it, that a killed process made but did not record, and never makes a second one. Only
instances an entry made (or sits at an entry's recorded placement) are ever destroyed: GIs
an admin made are left alone. An option whose slot already holds a MIG device of its profile
that no entry names (an admin's: discovery publishes such a slot as the option it stands for,
see `shared/vendors/nvidia/discovery.py`) is handed over as it is, recorded `adopted`, and
kept at unprepare. Placement: the highest free start first, since the 4g and 7g
profiles only fit at slice 0 (docs/hardware.md §1.1).

Every NVML call runs in a worker thread under `timeout_s`; while a timed-out call is still
stuck in the driver, later calls fail their claim at once instead of piling up threads. NVML
is loaded and initialised at the first call, so agents on other backends never load it.
"""

from __future__ import annotations

import asyncio
import functools
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import structlog

from shared.errors import BackendLoadError, ClaimError, InvalidOpaqueConfigError
from shared.nvml import ERROR_NOT_FOUND, Handle, NVMLCallError
from shared.pb.drasuite.v1 import inventory_pb2
from shared.vendors.nvidia import mig_nvml, naming
from shared.vendors.nvidia.caps import CapsNodeError, CapsNodes
from shared.vendors.nvidia.mig import GpuInstance, GpuInstanceProfile, Placement, is_profile_name
from shared.vendors.nvidia.mig_nvml import MigLibrary
from shared.vendors.parts.ledger import MALFORMED, Entry, StateFile, to_partition
from shared.vendors.parts.partitions import Partition, invalid_profile

__all__ = ["CAPABILITIES_ROOT", "KIND", "MigPartitionManager"]

log = structlog.get_logger(__name__)
T = TypeVar("T")

KIND = "MigPartitions"
CAPABILITIES_ROOT = Path("/proc/driver/nvidia/capabilities")
_GPU_NODE = re.compile(r"^/dev/nvidia\d+$")
_CAP_MINOR = re.compile(r"^DeviceFileMinor:\s*(\d+)\s*$", re.MULTILINE)
_NO_ROOM = frozenset({mig_nvml.ERROR_INSUFFICIENT_RESOURCES, mig_nvml.ERROR_IN_USE})


def _attribute(device: inventory_pb2.Device, name: str) -> inventory_pb2.AttributeValue | None:
    return device.attributes.get(name)


def _recorded_start(entry: Entry) -> object:
    """The start an entry records (None when it has none: a hand-edited entry)."""
    placement = entry.get("placement")
    return placement.get("start") if isinstance(placement, dict) else None


def _slot(device: inventory_pb2.Device, placement: int | None) -> tuple[str, int | None]:
    """The GPU a partition of `device` is carved from (its name) and where: a MIG slot is its
    parent at its own `placementStart`; anything else is itself, at `placement`."""
    start = _attribute(device, "placementStart")
    if device.kind == "mig" and device.parent and start is not None:
        return device.parent, start.int
    return device.name, placement


def _placement(entry: Entry) -> Placement:
    return Placement(int(entry["placement"]["start"]), int(entry["placement"]["size"]))


class MigPartitionManager:
    """A `PartitionManager` for the nvml backend over NVML and `mig-partitions.json`."""

    def __init__(
        self,
        path: Path,
        *,
        open_library: Callable[[], MigLibrary] = mig_nvml.open_library,
        capabilities_root: Path = CAPABILITIES_ROOT,
        caps_nodes: CapsNodes | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        self.state = StateFile(path, kind=KIND)
        self.capabilities_root = capabilities_root
        self.caps_nodes = caps_nodes
        """Makes missing `/dev/nvidia-caps` nodes; None leaves that to nvidia-modprobe."""
        self.timeout_s = timeout_s
        self._open_library = open_library
        self._library: MigLibrary | None = None
        self._lock = asyncio.Lock()
        self._pending: asyncio.Future[Any] | None = None

    def supports(self, backend: str) -> bool:
        return backend == "nvml"

    def check(
        self,
        *,
        claim_uid: str,
        device: inventory_pb2.Device,
        profile: str,
        placement: int | None = None,
    ) -> None:
        def invalid(reason: str) -> InvalidOpaqueConfigError:
            return invalid_profile(claim_uid, reason)

        if device.kind not in ("gpu", "mig"):
            raise invalid(f"MIG profiles need a GPU; {device.name} is a {device.kind or 'device'}")
        if not is_profile_name(profile):
            raise invalid(f"{profile!r} is not a MIG profile name (like 1g.10gb or 3g.40gb)")
        capable = _attribute(device, "migCapable")
        if device.kind == "gpu" and capable is not None and not capable.bool:
            raise invalid(f"device {device.name} cannot be partitioned with MIG")
        fixed = _attribute(device, "profile")
        if device.kind == "mig" and fixed is not None and fixed.string != profile:
            raise invalid(f"device {device.name} is a {fixed.string} placement, not {profile}")

    async def create(
        self,
        *,
        claim_uid: str,
        device: inventory_pb2.Device,
        profile: str,
        placement: int | None = None,
    ) -> Partition:
        async with self._lock:
            return await self._in_thread(
                claim_uid, functools.partial(self._create, claim_uid, device, profile, placement)
            )

    async def delete_claim(self, claim_uid: str) -> list[Partition]:
        async with self._lock:
            return await self._in_thread(claim_uid, functools.partial(self._delete, claim_uid))

    async def partitions(self) -> list[Partition]:
        async with self._lock:
            entries = await asyncio.to_thread(self.state.read, "")
            return [to_partition(e) for e in entries]

    async def _in_thread(self, claim_uid: str, call: Callable[[], T]) -> T:
        """`call` in a worker thread under the timeout; one stuck call fails the next ones."""
        if self._pending is not None and not self._pending.done():
            raise ClaimError(
                f"claim {claim_uid}: an earlier NVML call is still blocked in the driver",
                claim_uid=claim_uid,
            )
        pending = asyncio.ensure_future(asyncio.to_thread(call))
        pending.add_done_callback(_consume_result)
        self._pending = pending
        try:
            async with asyncio.timeout(self.timeout_s):
                return await asyncio.shield(pending)
        except TimeoutError as exc:
            raise ClaimError(
                f"claim {claim_uid}: NVML did not answer within {self.timeout_s}s",
                claim_uid=claim_uid,
            ) from exc

    # Everything below blocks: it runs in the worker thread.

    def _nvml(self, claim_uid: str) -> MigLibrary:
        if self._library is None:
            try:
                library = self._open_library()
                library.init()
            except (BackendLoadError, NVMLCallError) as exc:
                raise ClaimError(
                    f"claim {claim_uid}: cannot make MIG partitions: {exc}", claim_uid=claim_uid
                ) from exc
            self._library = library
        return self._library

    def _create(
        self, claim_uid: str, device: inventory_pb2.Device, profile: str, placement: int | None
    ) -> Partition:
        entries = self.state.read(claim_uid)
        carved_from, placement = _slot(device, placement)
        entry = next(
            (
                e
                for e in entries
                if e["claimUID"] == claim_uid
                and e["device"] in (carved_from, device.name)
                and (placement is None or _recorded_start(e) == placement)
            ),
            None,
        )
        if entry is not None and entry.get("profile") != profile:
            raise ClaimError(
                f"claim {claim_uid}: device {device.name} already has a {entry.get('profile')} "
                f"partition, not {profile}",
                claim_uid=claim_uid,
            )
        op = _Operation(self, self._nvml(claim_uid), claim_uid=claim_uid, device=device)
        try:
            if entry is None:
                entry = op.plan(profile, entries, placement, carved_from=carved_from)
                entries.append(entry)
                self.state.write(entries, claim_uid)
            else:
                log.info("partition_resumed", device=device.name, placement=entry["placement"])
            op.complete(entry, entries)
        except NVMLCallError as exc:  # a call no step above named
            raise op.fail(f"making a {profile} partition of {device.name}: {exc}") from exc
        except MALFORMED as exc:
            raise self.state.malformed(claim_uid, exc) from exc
        log.info("partition_created", device=device.name, profile=profile, id=entry["id"])
        return to_partition(entry)

    def _delete(self, claim_uid: str) -> list[Partition]:
        entries = self.state.read(claim_uid)
        mine = [e for e in entries if e["claimUID"] == claim_uid]
        if not mine:
            return []
        library = self._nvml(claim_uid)
        removed: list[Entry] = []
        errors: list[ClaimError] = []
        for entry in mine:
            if entry.get("adopted"):
                # Handed over as it was: it stays for whoever gets its slot next.
                removed.append(entry)
                continue
            try:
                _destroy(library, entry, entries, claim_uid=claim_uid)
                removed.append(entry)
            except ClaimError as exc:
                errors.append(exc)
            except MALFORMED as exc:
                errors.append(self.state.malformed(claim_uid, exc))
        if removed:
            self.state.write([e for e in entries if all(e is not r for r in removed)], claim_uid)
            log.info("partitions_deleted", ids=[e.get("id") for e in removed])
        if errors:
            raise errors[0]
        return [to_partition(e) for e in removed]


class _Operation:
    """Making one partition: the NVML calls and the entry they fill in (blocking)."""

    def __init__(
        self,
        manager: MigPartitionManager,
        library: MigLibrary,
        *,
        claim_uid: str,
        device: inventory_pb2.Device,
    ) -> None:
        self.manager = manager
        self.library = library
        self.claim_uid = claim_uid
        self.device = device

    def fail(self, message: str) -> ClaimError:
        return ClaimError(f"claim {self.claim_uid}: {message}", claim_uid=self.claim_uid)

    def call(self, what: str, function: Callable[..., T], *args: Any) -> T:
        """One NVML call; its failure fails the claim, naming the device and the step."""
        try:
            return function(*args)
        except NVMLCallError as exc:
            raise self.fail(f"{what} on {self.device.name}: {exc}") from exc

    def gpu_uuid(self) -> str:
        name = "parentUUID" if self.device.kind == "mig" else "uuid"
        found = _attribute(self.device, name)
        uuid = found.string if found is not None else ""
        uuid = uuid or (self.device.uuid if self.device.kind == "gpu" else "")
        if not uuid:
            raise self.fail(f"device {self.device.name} has no GPU UUID ({name}) in the inventory")
        return uuid

    def handle(self, uuid: str) -> Handle:
        try:
            return self.library.handle_by_uuid(uuid)
        except NVMLCallError as exc:
            if exc.code == ERROR_NOT_FOUND:
                raise self.fail(f"GPU {uuid} of {self.device.name} is not on this node") from exc
            raise self.fail(f"looking up GPU {uuid} of {self.device.name}: {exc}") from exc

    def plan(
        self, profile: str, entries: Sequence[Entry], start: int | None, *, carved_from: str
    ) -> Entry:
        """The entry for a new partition of `carved_from` (a GPU's name): its GPU, GI profile
        and a free placement (at `start` when given)."""
        uuid = self.gpu_uuid()
        handle = self.handle(uuid)
        self.require_mig_mode(handle, uuid)
        info = self.gi_profile(handle, profile)
        entry: Entry = {
            "claimUID": self.claim_uid,
            "device": carved_from,
            "profile": profile,
            "gpuUUID": uuid,
            "profileId": info.id,
            "createdUnixMs": int(time.time() * 1000),
        }
        there = self.unowned_mig_device(handle, info, uuid, entries, start)
        if there is not None:
            gi, ci = there
            log.info("mig_device_handed_over", device=self.device.name, gi=gi.id, ci=ci)
            placement = gi.placement
            entry.update(giId=gi.id, ciId=ci, adopted=True)
        else:
            placement = self.free_placement(handle, info, profile, uuid, entries, start)
        entry["placement"] = {"start": placement.start, "size": placement.size}
        return entry

    def unowned_mig_device(
        self,
        handle: Handle,
        info: GpuInstanceProfile,
        uuid: str,
        entries: Sequence[Entry],
        start: int | None,
    ) -> tuple[GpuInstance, int] | None:
        """The MIG device of the profile that already sits exactly at `start` and that no
        entry names (an administrator's): (its GI, its one CI). Discovery publishes such a
        slot as the same option as a free one, so the claim that got it gets it as it is."""
        if start is None:
            return None
        named = {e.get("giId") for e in entries if e.get("gpuUUID") == uuid}
        reserved = [_placement(e) for e in entries if e.get("gpuUUID") == uuid]
        for gi in self.gpu_instances(handle, [info.id]):
            if gi.placement.start != start or gi.id in named:
                continue
            if any(gi.placement.overlaps(r) for r in reserved):
                continue
            cis = _compute_instances(
                self.library, handle, gi.id, _ci_profiles(self.library, handle, gi.id)
            )
            if len(cis) == 1:
                return gi, cis[0]
        return None

    def require_mig_mode(self, handle: Handle, uuid: str) -> None:
        try:
            current, pending = self.library.mig_mode(handle)
        except NVMLCallError as exc:
            if exc.unsupported:
                raise self.fail(f"{self.device.name} ({uuid}) does not support MIG") from exc
            raise self.fail(f"reading the MIG mode of {self.device.name}: {exc}") from exc
        if current != 1:
            hint = (
                "it is enabled but pending: the GPU needs a reset"
                if pending == 1
                else "an admin enables it with `nvidia-smi -i <gpu> -mig 1`"
            )
            raise self.fail(f"MIG mode is not enabled on {self.device.name} ({uuid}); {hint}")

    def gi_profiles(self, handle: Handle) -> list[GpuInstanceProfile]:
        found: dict[int, GpuInstanceProfile] = {}
        for enum in range(mig_nvml.GI_PROFILE_ENUM_COUNT):
            try:
                info = self.library.gpu_instance_profile(handle, enum)
            except NVMLCallError as exc:
                if exc.unsupported:
                    continue
                raise self.fail(f"reading MIG profiles of {self.device.name}: {exc}") from exc
            found.setdefault(info.id, info)
        return list(found.values())

    def gi_profile(self, handle: Handle, profile: str) -> GpuInstanceProfile:
        profiles = self.gi_profiles(handle)
        for info in profiles:
            if info.short_name == profile:
                return info
        known = ", ".join(p.short_name for p in profiles) or "none"
        raise InvalidOpaqueConfigError(
            f"partition.profile: {profile!r} is not a MIG profile of {self.device.name} "
            f"(profiles: {known})",
            claim_uid=self.claim_uid,
            field="partition.profile",
        )

    def gpu_instances(self, handle: Handle, profile_ids: Sequence[int]) -> list[GpuInstance]:
        found: list[GpuInstance] = []
        for profile_id in profile_ids:
            found += self.call(
                "listing GPU instances", self.library.gpu_instances, handle, profile_id
            )
        return found

    def free_placement(
        self,
        handle: Handle,
        info: GpuInstanceProfile,
        profile: str,
        uuid: str,
        entries: Sequence[Entry],
        wanted_start: int | None,
    ) -> Placement:
        existing = self.gpu_instances(handle, [p.id for p in self.gi_profiles(handle)])
        # Placements recorded but not yet made (a process killed mid-way) stay reserved.
        taken = [gi.placement for gi in existing] + [
            _placement(e) for e in entries if e.get("gpuUUID") == uuid
        ]
        same_profile = sum(1 for gi in existing if gi.profile_id == info.id)
        candidates = self.call(
            "reading MIG placements", self.library.gpu_instance_placements, handle, info.id
        )
        start = _attribute(self.device, "placementStart")
        if self.device.kind == "mig" and start is not None:
            candidates = tuple(p for p in candidates if p.start == start.int)
        if wanted_start is not None:
            candidates = tuple(p for p in candidates if p.start == wanted_start)
            if not candidates:
                raise self.fail(
                    f"{wanted_start} is not a placement of profile {profile} on {self.device.name}"
                )
        free = [p for p in candidates if not any(p.overlaps(t) for t in taken)]
        if not free or same_profile >= info.instance_count:
            if wanted_start is not None:
                raise self.fail(
                    f"placement {wanted_start} for profile {profile} on {self.device.name} is taken"
                )
            raise self.no_room(profile)
        return max(free, key=lambda p: p.start)

    def no_room(self, profile: str) -> ClaimError:
        return self.fail(f"no free placement for profile {profile} on {self.device.name}")

    def complete(self, entry: Entry, entries: list[Entry]) -> None:
        """Make (or find) the entry's GI and CI, read the MIG device, record each step."""
        state, claim_uid = self.manager.state, self.claim_uid
        handle = self.handle(str(entry["gpuUUID"]))
        gi = self.gpu_instance(handle, entry, entries)
        if entry.get("giId") != gi.id:
            entry["giId"] = gi.id
            entry.pop("ciId", None)
            state.write(entries, claim_uid)
        ci = self.compute_instance(handle, gi.id, entry.get("ciId"))
        if entry.get("ciId") != ci:
            entry["ciId"] = ci
            state.write(entries, claim_uid)
        mig = self.call("reading the MIG device", self.library.mig_device_uuid, handle, gi.id, ci)
        minor = self.call("reading the GPU minor number", self.library.minor_number, handle)
        gi_dir = self.manager.capabilities_root / f"gpu{minor}" / "mig" / f"gi{gi.id}"
        caps = [self.cap_node(gi_dir / "access"), self.cap_node(gi_dir / f"ci{ci}" / "access")]
        mig = naming.mig_uuid(mig)
        entry.update(
            id=mig,
            env={"NVIDIA_VISIBLE_DEVICES": mig},
            deviceNodes=[self.gpu_node(minor), *caps],
        )
        state.write(entries, claim_uid)

    def gpu_instance(self, handle: Handle, entry: Entry, entries: list[Entry]) -> GpuInstance:
        profile_id, placement = int(entry["profileId"]), _placement(entry)
        at_placement = [
            gi
            for gi in self.gpu_instances(handle, [profile_id])
            if gi.placement == placement and gi.profile_id == profile_id
        ]
        for gi in at_placement:
            if gi.id == entry.get("giId"):
                return gi
        if "giId" not in entry:
            # Made by a process killed before it recorded the id: the entry was written first.
            named = {e.get("giId") for e in entries if e.get("gpuUUID") == entry["gpuUUID"]}
            for gi in at_placement:
                if gi.id not in named:
                    log.warning("mig_gpu_instance_adopted", device=self.device.name, gi=gi.id)
                    return gi
        try:
            return self.library.create_gpu_instance(handle, profile_id, placement)
        except NVMLCallError as exc:
            if "giId" not in entry:
                # Nothing was made for this entry, ever: drop it, or its placement stays taken.
                entries.remove(entry)
                self.manager.state.write(entries, self.claim_uid)
            if exc.code in _NO_ROOM:
                raise self.no_room(str(entry["profile"])) from exc
            raise self.fail(f"creating a GPU instance on {self.device.name}: {exc}") from exc

    def compute_instance(self, handle: Handle, gi: int, recorded: object) -> int:
        profiles = _ci_profiles(self.library, handle, gi)
        existing = _compute_instances(self.library, handle, gi, profiles)
        if isinstance(recorded, int) and recorded in existing:
            return recorded
        if existing:  # our GI: whatever CI is in it was made by a killed process of ours
            log.warning("mig_compute_instance_adopted", device=self.device.name, ci=existing[0])
            return existing[0]
        if not profiles:
            raise self.fail(f"GPU instance {gi} on {self.device.name} offers no compute profile")
        full = max(profiles, key=lambda p: p.slice_count)
        try:
            return self.library.create_compute_instance(handle, gi, full.id)
        except NVMLCallError as exc:
            raise self.fail(f"creating a compute instance on {self.device.name}: {exc}") from exc

    def cap_node(self, access: Path) -> tuple[str, str]:
        try:
            match = _CAP_MINOR.search(access.read_text())
        except OSError as exc:
            raise self.fail(f"reading MIG capability {access}: {exc.strerror or exc}") from exc
        if match is None:
            raise self.fail(f"MIG capability {access} has no DeviceFileMinor line")
        if self.manager.caps_nodes is not None:
            try:
                self.manager.caps_nodes.ensure(int(match.group(1)))
            except CapsNodeError as exc:
                raise self.fail(f"MIG capability of {self.device.name}: {exc}") from exc
        return naming.caps_node(int(match.group(1))), ""

    def gpu_node(self, minor: int) -> tuple[str, str]:
        for node in self.device.device_nodes:
            if _GPU_NODE.match(node.path):
                return node.path, node.host_path
        return f"/dev/nvidia{minor}", ""


def _ci_profiles(
    library: MigLibrary, handle: Handle, gi: int
) -> list[mig_nvml.ComputeInstanceProfile]:
    found: dict[int, mig_nvml.ComputeInstanceProfile] = {}
    for enum in range(mig_nvml.CI_PROFILE_ENUM_COUNT):
        if enum == mig_nvml.CI_PROFILE_SHARED_ENUM:
            continue
        try:
            info = library.compute_instance_profile(handle, gi, enum)
        except NVMLCallError as exc:
            if exc.unsupported:
                continue
            raise
        found.setdefault(info.id, info)
    return list(found.values())


def _compute_instances(
    library: MigLibrary,
    handle: Handle,
    gi: int,
    profiles: Sequence[mig_nvml.ComputeInstanceProfile],
) -> list[int]:
    found: list[int] = []
    for profile in profiles:
        found += [ci for ci in library.compute_instances(handle, gi, profile.id) if ci not in found]
    return found


def _destroy(
    library: MigLibrary, entry: Entry, entries: Sequence[Entry], *, claim_uid: str
) -> None:
    """Destroy the entry's CIs and GI; instances already gone are fine. ClaimError otherwise."""
    device, uuid = entry["device"], str(entry.get("gpuUUID", ""))
    where = f"claim {claim_uid}: removing the MIG partition of {device}"
    try:
        handle = library.handle_by_uuid(uuid)
    except NVMLCallError as exc:
        if exc.code == ERROR_NOT_FOUND:
            log.warning("mig_gpu_gone", device=device, gpu=uuid)
            return
        raise ClaimError(f"{where}: {exc}", claim_uid=claim_uid) from exc
    try:
        gi = _recorded_gpu_instance(library, handle, entry, entries)
        if gi is None:
            return
        for ci in _compute_instances(library, handle, gi, _ci_profiles(library, handle, gi)):
            _ignore_not_found(library.destroy_compute_instance, handle, gi, ci)
        _ignore_not_found(library.destroy_gpu_instance, handle, gi)
    except NVMLCallError as exc:
        busy = " (processes still use it)" if exc.code == mig_nvml.ERROR_IN_USE else ""
        raise ClaimError(f"{where}{busy}: {exc}", claim_uid=claim_uid) from exc


def _recorded_gpu_instance(
    library: MigLibrary, handle: Handle, entry: Entry, entries: Sequence[Entry]
) -> int | None:
    """The GI the entry made: its recorded id at its placement, or (never recorded) the GI at
    its placement that no other entry names. None when there is none (already gone)."""
    profile_id, placement = int(entry["profileId"]), _placement(entry)
    at_placement = [
        gi for gi in library.gpu_instances(handle, profile_id) if gi.placement == placement
    ]
    if "giId" in entry:
        return next((gi.id for gi in at_placement if gi.id == entry["giId"]), None)
    named = {e.get("giId") for e in entries if e.get("gpuUUID") == entry.get("gpuUUID")}
    return next((gi.id for gi in at_placement if gi.id not in named), None)


def _ignore_not_found(function: Callable[..., None], *args: Any) -> None:
    try:
        function(*args)
    except NVMLCallError as exc:
        if exc.code != ERROR_NOT_FOUND:
            raise


def _consume_result(future: asyncio.Future[Any]) -> None:
    """Retrieve the outcome of a call nobody waits for any more (it timed out)."""
    if not future.cancelled():
        future.exception()
