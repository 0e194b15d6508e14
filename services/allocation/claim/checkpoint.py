"""Crash-safe, versioned record of every claim this node prepared: one JSON file per claim UID.

Compatibility rule: within `apiVersion: dra-suite.io/v1` changes are additive only. Readers
ignore fields they do not know, and the checksum covers the whole document except itself, so old
and new agents read each other's files. A breaking change needs a new apiVersion; an agent leaves
a file of an apiVersion it does not know in place (it is not corrupt) and treats it as absent.
A corrupt file (bad JSON, bad checksum, missing fields) is renamed `*.corrupt`, never fatal.
A directory removed under a running agent is made again on the next write (or liveness check),
with every record the agent holds; one missing at start is noted (`lost_at_start`).
"""

from __future__ import annotations

import asyncio
import collections
import enum
import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import structlog

from services.allocation.claim.group_commit import DirectoryGroupCommit
from shared import atomicfile
from shared.errors import CheckpointCorruptError, CheckpointWriteError, ProgrammingError

__all__ = [
    "API_VERSION",
    "KIND",
    "CheckpointStore",
    "ClaimState",
    "PreparedClaim",
    "PreparedDevice",
    "PreparedMps",
    "PreparedPartition",
    "PreparedVfio",
    "decode",
    "encode",
    "safe_uid",
]

log = structlog.get_logger(__name__)

API_VERSION = "dra-suite.io/v1"
KIND = "PreparedClaim"
_SUFFIX = ".json"
# Claim UIDs become file names: RFC 4122 in practice, never a path separator or a dot.
_SAFE_UID = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,127}")


class ClaimState(enum.StrEnum):
    PREPARE_STARTED = "PrepareStarted"
    """The plan is stored; side effects (the CDI spec) may be partly done."""
    PREPARE_COMPLETED = "PrepareCompleted"


@dataclass(frozen=True, slots=True, kw_only=True)
class PreparedDevice:
    request_names: tuple[str, ...]
    pool: str
    device: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None = None
    admin_access: bool = False
    """The result had `adminAccess` (KEP-5018): the device as it is, no partition made for it
    and no share of it taken; stored so that a replayed or recovered record keeps it so."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PreparedPartition:
    """A partition the claim needs (stored before it is made) and, once made, its identity."""

    device: str
    profile: str
    partition_id: str = ""
    """Empty until the partition manager made it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PreparedMps:
    """The claim's own MPS control daemon (`services.allocation.mps`): the GPUs it serves, in
    its CUDA_VISIBLE_DEVICES order, and the limits it sets for them."""

    devices: tuple[str, ...]
    """GPU UUIDs (or indices where a device has none)."""
    thread_percentage: int | None = None
    pinned_mib: tuple[int | None, ...] = ()
    """Per device of `devices`: its pinned device memory limit in MiB; None: no limit."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PreparedVfio:
    """A device passed through to a virtual machine (docs/vfio.md): its PCI function and IOMMU
    group, stored in PrepareStarted before any function is bound to vfio-pci."""

    device: str
    pci_bus_id: str
    iommu_group: int


@dataclass(frozen=True, slots=True, kw_only=True)
class PreparedClaim:
    """The stored answer to NodePrepareResources for one claim, and what was written for it."""

    uid: str
    namespace: str
    name: str
    driver: str
    state: ClaimState
    devices: tuple[PreparedDevice, ...]
    cdi_spec: Mapping[str, Any] | None = None
    """The CDI spec written for the claim (regenerated from here if lost); None: no devices."""
    device_configs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """Request name -> the opaque DeviceConfig in force for it, normalised (`opaque.encode`)."""
    partitions: tuple[PreparedPartition, ...] = ()
    """Partitions made (or to make) for the claim; stored in PrepareStarted before any is
    made, so that a crash never leaves one that no record names."""
    device_metadata: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """Base request name -> its DeviceMetadata document (version-less, `metadata.document`),
    which the CDI spec mounts; regenerated from here if its file is lost. Empty: feature off."""
    mps: PreparedMps | None = None
    """The claim's MPS control daemon; stored in PrepareStarted before it is started, so that
    a crash never leaves one that no record names."""
    vfio: tuple[PreparedVfio, ...] = ()
    """The devices bound to vfio-pci for a virtual machine; stored in PrepareStarted before
    any is bound (the original drivers are in the VFIO ledger, `services.allocation.vfio`)."""

    def completed(self) -> PreparedClaim:
        return replace(self, state=ClaimState.PREPARE_COMPLETED)


def safe_uid(uid: str) -> bool:
    return _SAFE_UID.fullmatch(uid) is not None


def _checksum(document: Mapping[str, Any]) -> str:
    body = {key: value for key, value in document.items() if key != "checksum"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def encode(record: PreparedClaim) -> bytes:
    document: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"uid": record.uid, "namespace": record.namespace, "name": record.name},
        "driver": record.driver,
        "state": str(record.state),
        "devices": [_encode_device(d) for d in record.devices],
        "cdiSpec": record.cdi_spec,
    }
    if record.device_configs:
        # Additive within dra-suite.io/v1: older readers ignore it.
        document["deviceConfigs"] = {k: dict(v) for k, v in record.device_configs.items()}
    if record.device_metadata:
        document["deviceMetadata"] = {k: dict(v) for k, v in record.device_metadata.items()}
    if record.partitions:
        document["partitions"] = [
            {"deviceName": p.device, "profile": p.profile, "partitionID": p.partition_id}
            for p in record.partitions
        ]
    if record.mps is not None:
        document["mps"] = {
            "devices": list(record.mps.devices),
            "threadPercentage": record.mps.thread_percentage,
            "pinnedMiB": list(record.mps.pinned_mib),
        }
    if record.vfio:
        document["vfio"] = [
            {"deviceName": v.device, "pciBusID": v.pci_bus_id, "iommuGroup": v.iommu_group}
            for v in record.vfio
        ]
    document["checksum"] = _checksum(document)
    # Compact on purpose: `indent` would force the pure-Python encoder (~8x slower), and every
    # prepare writes two records. `jq .` shows a file readably.
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def _encode_device(device: PreparedDevice) -> dict[str, Any]:
    encoded: dict[str, Any] = {
        "requestNames": list(device.request_names),
        "poolName": device.pool,
        "deviceName": device.device,
        "cdiDeviceIDs": list(device.cdi_device_ids),
    }
    if device.share_id is not None:
        encoded["shareID"] = device.share_id
    if device.admin_access:
        encoded["adminAccess"] = True  # additive: older readers ignore it
    return encoded


def decode(data: bytes, *, path: Path) -> PreparedClaim:
    """Parse and verify one file; raises CheckpointCorruptError for anything unreadable."""
    try:
        document = json.loads(data)
        if not isinstance(document, dict):
            raise TypeError("not a JSON object")
        if document.get("checksum") != _checksum(document):
            raise ValueError("checksum mismatch")
        metadata = document["metadata"]
        return PreparedClaim(
            uid=str(metadata["uid"]),
            namespace=str(metadata["namespace"]),
            name=str(metadata["name"]),
            driver=str(document["driver"]),
            state=ClaimState(document["state"]),
            devices=tuple(_decode_device(d) for d in document["devices"]),
            cdi_spec=document.get("cdiSpec"),
            device_configs=dict(document.get("deviceConfigs") or {}),
            device_metadata=dict(document.get("deviceMetadata") or {}),
            partitions=tuple(
                PreparedPartition(
                    device=str(p["deviceName"]),
                    profile=str(p["profile"]),
                    partition_id=str(p.get("partitionID", "")),
                )
                for p in document.get("partitions") or ()
            ),
            mps=_decode_mps(document.get("mps")),
            vfio=tuple(
                PreparedVfio(
                    device=str(v["deviceName"]),
                    pci_bus_id=str(v["pciBusID"]),
                    iommu_group=int(v["iommuGroup"]),
                )
                for v in document.get("vfio") or ()
            ),
        )
    except (ValueError, TypeError, KeyError) as exc:
        raise CheckpointCorruptError(f"checkpoint {path}: {exc}", path=str(path)) from exc


def _decode_mps(mps: Mapping[str, Any] | None) -> PreparedMps | None:
    if mps is None:
        return None
    percentage = mps.get("threadPercentage")
    return PreparedMps(
        devices=tuple(str(d) for d in mps["devices"]),
        thread_percentage=None if percentage is None else int(percentage),
        pinned_mib=tuple(None if m is None else int(m) for m in mps.get("pinnedMiB") or ()),
    )


def _decode_device(device: Mapping[str, Any]) -> PreparedDevice:
    share_id = device.get("shareID")
    return PreparedDevice(
        request_names=tuple(str(n) for n in device["requestNames"]),
        pool=str(device["poolName"]),
        device=str(device["deviceName"]),
        cdi_device_ids=tuple(str(i) for i in device["cdiDeviceIDs"]),
        share_id=None if share_id is None else str(share_id),
        admin_access=device.get("adminAccess") is True,
    )


def _restore(directory: Path, records: list[tuple[Path, bytes]]) -> None:
    """Make `directory` and write `records` into it, durably (one directory fsync)."""
    atomicfile.make_dirs(directory, mode=0o700)
    for path, data in records:
        atomicfile.write_and_rename(path, data)
    atomicfile.fsync_dir(directory)


def _probe_writable(directory: Path) -> None:
    """Create and remove a file in `directory`; raises OSError where that is impossible."""
    probe = directory / f".probe-{os.getpid()}"
    os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600))
    os.unlink(probe)


def _version_of(data: bytes) -> tuple[str, str] | None:
    """(apiVersion, kind) when the file is a JSON object that has them, else None."""
    try:
        document = json.loads(data)
    except ValueError:
        return None
    if not isinstance(document, dict):
        return None
    return str(document.get("apiVersion", "")), str(document.get("kind", ""))


class CheckpointStore:
    """All records of one node in memory, mirrored to `<directory>/<uid>.json`.

    Callers serialise access per claim UID (the preparer's lock); writes of different claims go
    to different files and may run concurrently, and then share directory fsyncs (group
    commit): `put` and `delete` still return only once their own change is durable.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.commit = DirectoryGroupCommit(directory, store="checkpoint")
        self._records: dict[str, PreparedClaim] = {}
        self._uids_by_name: dict[tuple[str, str], set[str]] = {}
        self._stamps: dict[str, tuple[int, int, int]] = {}
        self.writes: collections.Counter[tuple[str, ClaimState]] = collections.Counter()
        """Files written per (claim UID, state): proof that a claim was prepared once."""
        self.lost_at_start = False
        """True when `load` found no directory and no record was written since (recovery,
        which runs first, sees it): claims the kubelet believes prepared may have no record,
        so their CDI specs and partitions must stay. A fresh node looks the same, and has
        none of them."""
        self._restoring = asyncio.Lock()

    def load(self) -> list[PreparedClaim]:
        """Read every record at start; corrupt files are quarantined and skipped."""
        self.lost_at_start = not self.directory.is_dir()
        if self.lost_at_start:
            log.warning("checkpoint_directory_missing", directory=str(self.directory))
        atomicfile.make_dirs(self.directory, mode=0o700)
        self._records.clear()
        self._uids_by_name.clear()
        self._stamps.clear()
        for path in sorted(self.directory.glob(f"*{_SUFFIX}")):
            record = self._load_one(path)
            if record is not None:
                self._remember(record)
        log.info("checkpoint_loaded", directory=str(self.directory), claims=len(self._records))
        return list(self._records.values())

    def _load_one(self, path: Path) -> PreparedClaim | None:
        data = path.read_bytes()
        version = _version_of(data)
        if version is not None and version[0] != API_VERSION and version[1] == KIND:
            log.error("checkpoint_version_unsupported", path=str(path), api_version=version[0])
            return None
        try:
            record = decode(data, path=path)
        except CheckpointCorruptError as exc:
            quarantined = path.with_name(path.name + ".corrupt")
            path.replace(quarantined)
            log.error("checkpoint_quarantined", path=str(quarantined), error=str(exc))
            return None
        if path.name != f"{record.uid}{_SUFFIX}":
            log.error("checkpoint_misnamed", path=str(path), claim_uid=record.uid)
            return None
        return record

    def sync(self) -> None:
        """Re-read what other plugin instances changed; call it under the instance lock.

        Files are replaced atomically, so a changed (inode, mtime, size) stamp means a new
        version; unchanged files are not read again.
        """
        atomicfile.make_dirs(self.directory, mode=0o700)
        stamps: dict[str, tuple[int, int, int]] = {}
        for path in self.directory.glob(f"*{_SUFFIX}"):
            uid = path.name.removesuffix(_SUFFIX)
            try:
                stat = path.stat()
            except FileNotFoundError:
                continue
            stamp = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
            if self._stamps.get(uid) != stamp or uid not in self._records:
                try:
                    record = self._load_one(path)
                except FileNotFoundError:
                    record = None
                if record is None:
                    continue
                self._remember(record)
            stamps[uid] = stamp
        for uid in set(self._records) - set(stamps):
            self._forget(uid)
        self._stamps = stamps

    def remove_temporaries(self) -> list[Path]:
        """Remove half-written records left by a crash (`.<uid>.json.tmp-<pid>`); at start only."""
        removed = sorted(self.directory.glob(f".*{_SUFFIX}.tmp-*"))
        for path in removed:
            atomicfile.remove(path)
        return removed

    def uids_named(self, namespace: str, name: str) -> list[str]:
        """UIDs of the records of the claim `namespace/name` (old and new incarnations)."""
        return sorted(self._uids_by_name.get((namespace, name), ()))

    def get(self, uid: str) -> PreparedClaim | None:
        return self._records.get(uid)

    def stored(self, uid: str) -> bool:
        """Whether the record of `uid` is on disk (not only in memory)."""
        return self._path(uid).is_file()

    async def unusable(self) -> str | None:
        """Liveness check: None when records can be written here (a vanished directory is
        made again, with every record), else why not."""
        try:
            await self._restore_directory()
            await asyncio.to_thread(_probe_writable, self.directory)
        except OSError as exc:
            return f"checkpoint directory {self.directory}: {exc.strerror or exc}"
        return None

    async def _restore_directory(self) -> None:
        """If the directory is gone, make it again and write every record held in memory: the
        kubelet was told about them, and a restart must find them."""
        async with self._restoring:
            if await asyncio.to_thread(self.directory.is_dir):
                return
            records = [(self._path(r.uid), encode(r)) for r in self._records.values()]
            await asyncio.to_thread(_restore, self.directory, records)
            log.warning(
                "checkpoint_directory_recreated",
                directory=str(self.directory),
                records=len(records),
            )

    def records(self) -> list[PreparedClaim]:
        return list(self._records.values())

    async def put(self, record: PreparedClaim, *, durable: bool = True) -> None:
        """Write `record` atomically; when `durable`, return only once it survives a power
        loss too. A record that is not durable is visible to this node's processes at once
        (kill -9 keeps it) and may be lost, or read as corrupt and quarantined, after a
        reboot."""
        path = self._path(record.uid)
        data = encode(record)
        try:
            try:
                await self._write(path, data, durable=durable)
            except FileNotFoundError:
                await self._restore_directory()
                await self._write(path, data, durable=durable)
        except OSError as exc:
            raise self.write_error(record, exc) from exc
        self.put_done(record)

    def put_unsynced_blocking(self, record: PreparedClaim, data: bytes) -> None:
        """The file write of `put(record, durable=False)` (`data`: `encode(record)`),
        blocking, for a worker thread that has other writes to make in the same trip; the
        caller then calls `put_done`. A lost directory is not restored here:
        FileNotFoundError tells the caller to `put`."""
        atomicfile.write_and_rename(self._path(record.uid), data, sync=False)

    def put_done(self, record: PreparedClaim) -> None:
        """`record` is on disk: it is the claim's record now."""
        self._remember(record)
        self.writes[(record.uid, record.state)] += 1
        self.lost_at_start = False

    def write_error(self, record: PreparedClaim, exc: OSError) -> CheckpointWriteError:
        return CheckpointWriteError(
            f"prepare claim {record.uid}: writing checkpoint {self._path(record.uid)}: {exc}",
            claim_uid=record.uid,
        )

    async def _write(self, path: Path, data: bytes, *, durable: bool) -> None:
        if durable:
            await self.commit.replace(path, data)
        else:
            await asyncio.to_thread(atomicfile.write_and_rename, path, data, sync=False)

    async def delete(self, uid: str) -> None:
        path = self._path(uid)
        try:
            await self.commit.remove(path)
        except OSError as exc:
            raise CheckpointWriteError(
                f"unprepare claim {uid}: removing checkpoint {path}: {exc}", claim_uid=uid
            ) from exc
        self._forget(uid)
        # Counted per claim lifetime only: a long-running agent must not grow per claim seen.
        for state in ClaimState:
            self.writes.pop((uid, state), None)

    def _remember(self, record: PreparedClaim) -> None:
        self._forget(record.uid)
        self._records[record.uid] = record
        self._uids_by_name.setdefault((record.namespace, record.name), set()).add(record.uid)

    def _forget(self, uid: str) -> None:
        record = self._records.pop(uid, None)
        if record is None:
            return
        key = (record.namespace, record.name)
        uids = self._uids_by_name.get(key, set())
        uids.discard(uid)
        if not uids:
            self._uids_by_name.pop(key, None)

    def _path(self, uid: str) -> Path:
        if not safe_uid(uid):
            raise ProgrammingError(f"claim uid {uid!r} is not safe as a file name")
        return self.directory / f"{uid}{_SUFFIX}"
