"""The sim backend's partition manager: MIG-like and vNPU-like partitions in a JSON state file.

The sim makes partitions for real in its model: a state file under the plugin data dir
(`sim-partitions.json`, written atomically) lists every partition with its claim, device,
profile and identity, and a device only takes partitions while it has room (7 compute and 8
memory slices for a GPU, its `aiCore` count for an NPU). Every call reads the file afresh, so
two plugin instances (rolling update, under the instance lock) and a restarted process see the
same partitions; creation is idempotent by (claim UID, device, placement), so a retry after
kill -9 never makes a second one.

Placements (GPU only): a partition asked for at a placement (an option made on demand) sits
on the memory slices `[start, start + memory slices)`, where `start` must be one of the
profile's H100 placement starts (docs/hardware.md §1.1); it is made there or not at all, and fails
its claim when a placed partition of the device overlaps those slices. A partition made
without a placement takes no particular slices, only room.

Profiles: GPU (kind `gpu`) H100-80GB MIG names (docs/hardware.md §1.2), identity `MIG-<uuid4>`,
nodes: the GPU's own plus `/dev/nvidia-caps/nvidia-cap<gi>` and `<ci>`, numbered as in
`/proc/driver/nvidia-caps/mig-minors` (`shared.vendors.nvidia.naming`: 3 + 9 * (15 * gpu + gi),
the CI after it; a model, not in docs/hardware.md). NPU (kind `npu`) vNPU templates
(docs/hardware.md §3.6), identity the vNPU id in `[phy*16+100, phy*16+115]`, node
`/dev/davinci<vnpu>` with `ASCEND_VISIBLE_DEVICES=<vnpu>` and `ASCEND_RUNTIME_OPTIONS=VIRTUAL`.
Host paths are the device's own host path (`/dev/null` in the shipped profiles), so specs also
run under a real runtime.
"""

from __future__ import annotations

import asyncio
import collections
import json
import re
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from shared import atomicfile
from shared.errors import ClaimError, InvalidOpaqueConfigError
from shared.pb.drasuite.v1 import inventory_pb2
from shared.vendors.nvidia import naming
from shared.vendors.nvidia.mig import COMPUTE_SLICES, H100_80GB, MEMORY_SLICES
from shared.vendors.parts.partitions import Partition

__all__ = [
    "API_VERSION",
    "GPU_PLACEMENTS",
    "GPU_PROFILES",
    "KIND",
    "NPU_TEMPLATES",
    "SimPartitionManager",
]

log = structlog.get_logger(__name__)

API_VERSION = "dra-suite.io/v1"
KIND = "SimPartitions"
GPU_PROFILES: dict[str, tuple[int, int]] = {
    p.name: (p.info.slice_count, p.memory_slices) for p in H100_80GB
}
"""Profile -> (compute slices, memory slices) of an H100-80GB."""
GPU_PLACEMENTS: dict[str, tuple[int, ...]] = {p.name: p.starts for p in H100_80GB}
"""Profile -> the memory slices an H100-80GB instance of it may start at."""
_GPU_SLICES = (COMPUTE_SLICES, MEMORY_SLICES)
_GPU_INSTANCES = 7
NPU_TEMPLATES = frozenset(
    {
        "vir03_1c_8g",
        "vir05_1c_8g",
        "vir05_1c_16g",
        "vir06_1c_16g",
        "vir10_3c_16g",
        "vir10_3c_16g_nm",
        "vir10_3c_32g",
        "vir10_4c_16g_m",
        "vir12_3c_32g",
    }
)
"""Atlas A2 (910B) vNPU templates; `virNN` is NN AI cores."""
_TEMPLATE_CORES = re.compile(r"^vir(\d+)")
_VNPU_IDS = 16
_DEFAULT_AI_CORES = 20


@dataclass(frozen=True, slots=True)
class _Size:
    """What a partition takes of its device: (compute, memory) slices or (AI cores, 0)."""

    compute: int
    memory: int


def _size(device: inventory_pb2.Device, profile: str, claim_uid: str) -> _Size:
    if device.kind == "gpu" and profile in GPU_PROFILES:
        return _Size(*GPU_PROFILES[profile])
    if device.kind == "npu" and profile in NPU_TEMPLATES:
        match = _TEMPLATE_CORES.match(profile)
        return _Size(int(match.group(1)) if match else 0, 0)
    known = sorted(GPU_PROFILES) if device.kind == "gpu" else sorted(NPU_TEMPLATES)
    choices = ", ".join(known) if device.kind in ("gpu", "npu") else "none"
    raise InvalidOpaqueConfigError(
        f"partition.profile: {profile!r} is not a profile of {device.kind} device "
        f"{device.name} (profiles: {choices})",
        claim_uid=claim_uid,
        field="partition.profile",
    )


def _check_placement(
    device: inventory_pb2.Device, profile: str, placement: int, claim_uid: str
) -> None:
    """A placement must be one of the profile's starts (only GPUs have placements)."""
    starts = GPU_PLACEMENTS.get(profile, ()) if device.kind == "gpu" else ()
    if placement not in starts:
        where = ", ".join(map(str, starts)) if starts else "none"
        raise ClaimError(
            f"claim {claim_uid}: {placement} is not a placement of a {profile} partition of "
            f"{device.kind or 'device'} {device.name} (placements: {where})",
            claim_uid=claim_uid,
        )


def _check_free(
    device: inventory_pb2.Device,
    profile: str,
    placement: int,
    on_device: list[dict[str, Any]],
    claim_uid: str,
) -> None:
    """Fail the claim when a placed partition of the device holds a slice of this placement."""
    wanted = range(placement, placement + GPU_PROFILES[profile][1])
    for entry in on_device:
        start = entry.get("placement")
        if not isinstance(start, int):
            continue
        held = range(start, start + int(entry["memory"]))
        if max(wanted.start, held.start) < min(wanted.stop, held.stop):
            raise ClaimError(
                f"claim {claim_uid}: placement {placement} of device {device.name} for a "
                f"{profile} partition is taken: claim {entry['claimUID']} has a "
                f"{entry['profile']} partition at placement {start}",
                claim_uid=claim_uid,
            )


def _room(device: inventory_pb2.Device) -> _Size:
    if device.kind == "gpu":
        return _Size(*_GPU_SLICES)
    cores = device.capacity.get("aiCore", "")
    return _Size(int(cores) if cores.isdigit() else _DEFAULT_AI_CORES, 0)


def _int_attribute(device: inventory_pb2.Device, *names: str) -> int:
    for name in names:
        if name in device.attributes:
            return device.attributes[name].int
    return 0


def _host(device: inventory_pb2.Device, default: str) -> str:
    hosts = [node.host_path for node in device.device_nodes if node.host_path]
    return hosts[0] if hosts else default


class SimPartitionManager:
    """A `PartitionManager` for the sim backend over `<plugin data dir>/sim-partitions.json`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = asyncio.Lock()
        self.creates: collections.Counter[tuple[str, str]] = collections.Counter()
        """Partitions made per (claim UID, device) by this process: proof of idempotence."""

    def supports(self, backend: str) -> bool:
        return backend == "sim"

    def check(
        self,
        *,
        claim_uid: str,
        device: inventory_pb2.Device,
        profile: str,
        placement: int | None = None,
    ) -> None:
        size = _size(device, profile, claim_uid)
        room = _room(device)
        if size.compute > room.compute or size.memory > room.memory:
            raise InvalidOpaqueConfigError(
                f"partition.profile: {profile!r} is larger than device {device.name}",
                claim_uid=claim_uid,
                field="partition.profile",
            )
        if placement is not None:
            _check_placement(device, profile, placement, claim_uid)

    async def create(
        self,
        *,
        claim_uid: str,
        device: inventory_pb2.Device,
        profile: str,
        placement: int | None = None,
    ) -> Partition:
        async with self._lock:
            entries = await asyncio.to_thread(self._read, claim_uid)
            for entry in entries:
                if (entry["claimUID"], entry["device"]) == (claim_uid, device.name) and entry.get(
                    "placement"
                ) == placement:
                    return self._existing(entry, profile)
            on_device = [e for e in entries if e["device"] == device.name]
            entry = self._new_entry(claim_uid, device, profile, on_device, placement)
            await asyncio.to_thread(self._write, [*entries, entry], claim_uid)
            self.creates[(claim_uid, device.name)] += 1
            log.info(
                "partition_created",
                device=device.name,
                profile=profile,
                placement=placement,
                id=entry["id"],
            )
            return _partition(entry)

    def _existing(self, entry: dict[str, Any], profile: str) -> Partition:
        if entry["profile"] != profile:
            raise ClaimError(
                f"claim {entry['claimUID']}: device {entry['device']} already has a "
                f"{entry['profile']} partition, not {profile}",
                claim_uid=str(entry["claimUID"]),
            )
        log.info("partition_reused", device=entry["device"], id=entry["id"])
        return _partition(entry)

    def _new_entry(
        self,
        claim_uid: str,
        device: inventory_pb2.Device,
        profile: str,
        on_device: list[dict[str, Any]],
        placement: int | None,
    ) -> dict[str, Any]:
        size, room = _size(device, profile, claim_uid), _room(device)
        if placement is not None:
            _check_placement(device, profile, placement, claim_uid)
            _check_free(device, profile, placement, on_device, claim_uid)
        used = _Size(
            sum(int(e["compute"]) for e in on_device), sum(int(e["memory"]) for e in on_device)
        )
        if used.compute + size.compute > room.compute or used.memory + size.memory > room.memory:
            raise ClaimError(
                f"claim {claim_uid}: device {device.name} has no room for a {profile} partition "
                f"({len(on_device)} partitions on it)",
                claim_uid=claim_uid,
            )
        slots = {int(e["slot"]) for e in on_device}
        slot = min(set(range(_VNPU_IDS)) - slots)
        entry: dict[str, Any] = {
            "claimUID": claim_uid,
            "device": device.name,
            "profile": profile,
            "slot": slot,
            "compute": size.compute,
            "memory": size.memory,
            "createdUnixMs": int(time.time() * 1000),
        }
        if placement is not None:
            entry["placement"] = placement
        entry.update(_gpu_edits(device, slot) if device.kind == "gpu" else _npu_edits(device, slot))
        return entry

    async def delete_claim(self, claim_uid: str) -> list[Partition]:
        async with self._lock:
            entries = await asyncio.to_thread(self._read, claim_uid)
            gone = [e for e in entries if e["claimUID"] == claim_uid]
            if gone:
                kept = [e for e in entries if e["claimUID"] != claim_uid]
                await asyncio.to_thread(self._write, kept, claim_uid)
                log.info("partitions_deleted", ids=[e["id"] for e in gone])
            return [_partition(e) for e in gone]

    async def partitions(self) -> list[Partition]:
        async with self._lock:
            return [_partition(e) for e in await asyncio.to_thread(self._read, "")]

    def _read(self, claim_uid: str) -> list[dict[str, Any]]:
        """The entries on disk; an unreadable file fails the claim at hand (never guessed at)."""
        try:
            document = json.loads(self.path.read_bytes())
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as exc:
            raise ClaimError(
                f"sim partition state {self.path}: {exc}", claim_uid=claim_uid
            ) from exc
        if not isinstance(document, dict) or document.get("kind") != KIND:
            raise ClaimError(
                f"sim partition state {self.path} is not a {KIND} document", claim_uid=claim_uid
            )
        return list(document.get("partitions") or [])

    def _write(self, entries: list[dict[str, Any]], claim_uid: str) -> None:
        document = {"apiVersion": API_VERSION, "kind": KIND, "partitions": entries}
        data = json.dumps(document, indent=2, sort_keys=True).encode()
        try:
            atomicfile.make_dirs(self.path.parent, mode=0o750)
            self._remove_temporaries()
            atomicfile.write_atomic(self.path, data)
        except OSError as exc:
            raise ClaimError(
                f"sim partition state {self.path}: writing: {exc}", claim_uid=claim_uid
            ) from exc

    def _remove_temporaries(self) -> None:
        """Remove half-written state files of a process killed while writing. Safe here:
        writes are serialized (this manager's lock, and the preparer's instance lock between
        plugin instances), so no other writer has one in flight."""
        for path in atomicfile.remove_temporaries(self.path):
            log.warning("temporary_file_removed", path=str(path))


def _gpu_edits(device: inventory_pb2.Device, gi: int) -> dict[str, Any]:
    gpu = _int_attribute(device, "index", "minor")
    host = _host(device, "")
    minors = (naming.gpu_instance_cap(gpu, gi), naming.compute_instance_cap(gpu, gi, 0))
    caps = [(naming.caps_node(m), host) for m in minors]
    own = [(node.path, node.host_path) for node in device.device_nodes]
    mig = naming.mig_uuid(str(uuid.uuid4()))
    return {"id": mig, "env": {"NVIDIA_VISIBLE_DEVICES": mig}, "deviceNodes": own + caps}


def _npu_edits(device: inventory_pb2.Device, slot: int) -> dict[str, Any]:
    vnpu = _int_attribute(device, "physicalId", "index") * _VNPU_IDS + 100 + slot
    node = (f"/dev/davinci{vnpu}", _host(device, f"/dev/vdavinci{vnpu}"))
    env = {"ASCEND_VISIBLE_DEVICES": str(vnpu), "ASCEND_RUNTIME_OPTIONS": "VIRTUAL"}
    return {"id": str(vnpu), "env": env, "deviceNodes": [node]}


def _partition(entry: dict[str, Any]) -> Partition:
    return Partition(
        claim_uid=str(entry["claimUID"]),
        device=str(entry["device"]),
        profile=str(entry["profile"]),
        id=str(entry["id"]),
        env={str(k): str(v) for k, v in dict(entry.get("env") or {}).items()},
        device_nodes=tuple((str(p), str(h)) for p, h in entry.get("deviceNodes") or ()),
    )
