"""ClaimPreparer: NodePrepareResources/NodeUnprepareResources semantics, claim by claim.

Per claim UID one lock (claims of a batch run concurrently); with rolling updates also the
instance lock (`serialize.InstanceLock`), under which the checkpoint is re-read from disk, since
another instance may have changed it. The checkpoint is read first, so a repeated prepare
returns the stored answer. `planning.plan()` computes what a claim needs (pure; may run twice);
only then come the side effects, in a crash-safe order: checkpoint PrepareStarted and (device
metadata files, then) CDI spec -> checkpoint PrepareCompleted (fsynced before the kubelet is
answered). A claim that asks for partitions stores PrepareStarted (naming them) first, then has
the partition manager make them (idempotent by claim UID and device), then plans its spec with
them; an option made on demand is made as a partition of its parent at its own placement. A
claim that shares a GPU (`mps`) stores PrepareStarted (naming its MPS daemon) durably, then
starts or adopts its daemon, then writes its spec; recovery keeps the daemon of every completed
claim running and stops those no record names. A claim for a virtual machine (`vfio`,
docs/vfio.md) stores PrepareStarted (naming each device's PCI function) durably, then has the
VFIO binder move the functions to vfio-pci (recording their drivers first), then writes its
spec; unprepare binds the original drivers back; recovery rebinds completed claims' functions
and releases those of claims without a record.
Unprepare removes the CDI spec, then the claim's metadata files, MPS daemon and partitions,
then the checkpoint; unknown claims unprepare cleanly. A UID prepared under one claim name is
refused under another. At start, partitions that no record names are orphans (a quarantined
record) and are removed. A claim recreated under the same name (new UID) waits, bounded, until
the preparation of the old UID is unprepared (docs/contracts.md §10).

Fault-injection seam: `crash_at` names a step (`config.CRASH_STEPS`) at which the process exits
at once with code 137, as a kill -9 would; the kill -9 tests set it through `cli` only.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
from collections.abc import AsyncIterator, Coroutine, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

import structlog

from services.allocation import instruments
from services.allocation.cdi import allowlist
from services.allocation.cdi.spec_files import CDIWriter
from services.allocation.cdi.spec_files import encode as encode_spec
from services.allocation.claim import echo
from services.allocation.claim.checkpoint import (
    CheckpointStore,
    ClaimState,
    PreparedClaim,
    PreparedPartition,
    safe_uid,
)
from services.allocation.claim.checkpoint import encode as encode_record
from services.allocation.claim.claims import AllocatedClaim, ClaimRef, PodRef
from services.allocation.dra import batch
from services.allocation.dra.hot_path import KubeletCalls
from services.allocation.dra.planning import CLAIM_UID_ENV, DEVICES_ENV, find_device, plan
from services.allocation.dra.serialize import InstanceLock
from services.allocation.metadata.files import MetadataFiles
from services.allocation.mps.daemons import MpsDaemons
from services.allocation.vfio.binder import VfioBinder
from shared import telemetry
from shared.errors import ClaimError, ClaimUIDMismatchError
from shared.pb.drasuite.v1 import inventory_pb2
from shared.vendors.parts.partitions import Partition, PartitionManager, on_demand_option

__all__ = [
    "CLAIM_UID_ENV",
    "CRASH_EXIT_CODE",
    "DEVICES_ENV",
    "ClaimPreparer",
    "ClaimSource",
    "InventorySource",
    "PreparedClaimSink",
    "plan",
]

log = structlog.get_logger(__name__)
tracer = telemetry.tracer(__name__)
T = TypeVar("T")

CRASH_EXIT_CODE = 137
"""What the fault-injection seam exits with: the status of a process killed by SIGKILL."""
_POLL_S = 0.05
"""How often a bounded wait (a replaced claim's unprepare, the first inventory) looks again."""


class ClaimSource(Protocol):
    """Where allocated claims come from (the API server through `claims.ClaimReader`); a
    read with a `deadline` (event loop time) ends by then."""

    async def read(self, ref: ClaimRef, *, deadline: float | None = None) -> AllocatedClaim: ...


class PreparedClaimSink(Protocol):
    """Where completed prepares and unprepares are announced (`claim_publisher`); both calls
    return at once, so that a prepare never waits on NATS."""

    def prepared(
        self,
        record: PreparedClaim,
        *,
        pods: Sequence[PodRef] | None,
        resource: Mapping[str, Any] | None = None,
    ) -> None:
        """`pods` and `resource` (the claim object) as this prepare read them; None when it
        answered from the checkpoint without reading the claim."""

    def unprepared(self, uid: str) -> None: ...


class InventorySource(Protocol):
    """The last inventory of this node, or None before the first one arrived."""

    @property
    def current(self) -> inventory_pb2.Inventory | None: ...


@dataclasses.dataclass(frozen=True, slots=True)
class _SpecFiles:
    """A claim's CDI spec and the metadata files it mounts, encoded for a worker thread."""

    metadata: list[tuple[Path, bytes]]
    spec: bytes


class _KeyedLocks:
    """One asyncio.Lock per key, dropped when nobody holds or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(key, (asyncio.Lock(), 0))
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)


class ClaimPreparer:
    def __init__(
        self,
        *,
        claims: ClaimSource,
        inventory: InventorySource,
        checkpoints: CheckpointStore,
        cdi_writer: CDIWriter,
        driver: str,
        backend: str,
        instance_lock: InstanceLock | None = None,
        replaced_claim_wait_s: float = 5.0,
        inventory_wait_s: float = 10.0,
        crash_at: str = "",
        partitions: PartitionManager | None = None,
        announce: PreparedClaimSink | None = None,
        metadata_files: MetadataFiles | None = None,
        device_metadata: bool = False,
        mps: MpsDaemons | None = None,
        vfio: VfioBinder | None = None,
        calls: KubeletCalls | None = None,
    ) -> None:
        """`backend`: the node's own (`--backend`), which picks the container edits and their
        allowlist, never the inventory's. `announce`: told of each completed prepare and
        unprepare (the prepared-claims KV). `metadata_files`: where device metadata files are
        kept (written, regenerated, removed); new claims get them only with `device_metadata`.
        `mps`: the MPS control daemons; with it, a claim that shares a GPU gets its own.
        `vfio`: binds devices to vfio-pci for claims that pass them through to a VM; None:
        such claims fail. `calls`: marks each prepare and unprepare call in flight, for
        background writers to give way to."""
        self._claims = claims
        self._inventory = inventory
        self._checkpoints = checkpoints
        self._cdi = cdi_writer
        self._driver = driver
        self._backend = backend
        self._locks = _KeyedLocks()
        self._instance = instance_lock or InstanceLock(None)
        self._replaced_wait_s = replaced_claim_wait_s
        self._inventory_wait_s = inventory_wait_s
        self._crash_at = crash_at
        self._partitions = partitions
        self._announce = announce
        self._metadata = metadata_files
        self._metadata_root = (
            metadata_files.mount_root if metadata_files is not None and device_metadata else None
        )
        self._mps = mps
        self._mps_root = mps.mount_root if mps is not None else None
        self._vfio = vfio
        self._vfio_metadata_root = metadata_files.mount_root if metadata_files else None
        self._calls = calls or KubeletCalls()

    async def prepare_batch(
        self, refs: Sequence[ClaimRef], *, deadline: float | None = None
    ) -> dict[str, PreparedClaim | ClaimError]:
        """Prepare every claim (`batch.MAX_IN_FLIGHT` at once); a ClaimError is that claim's
        answer, anything else propagates. By `deadline` (event loop time) claim reads end
        and no claim starts: those get their own error, so that the call answers in time."""

        async def step(ref: ClaimRef) -> PreparedClaim:
            return await instruments.timed(
                instruments.PREPARE_SECONDS, self.prepare(ref, deadline=deadline)
            )

        with self._calls.busy():
            return _collect(refs, await batch.run(refs, step))

    async def unprepare_batch(self, refs: Sequence[ClaimRef]) -> dict[str, ClaimError | None]:
        async def step(ref: ClaimRef) -> None:
            await instruments.timed(instruments.UNPREPARE_SECONDS, self.unprepare(ref))

        with self._calls.busy():
            return _collect(refs, await batch.run(refs, step))

    @contextlib.asynccontextmanager
    async def _serialized(self, uid: str) -> AsyncIterator[None]:
        """The claim's lock, then the instance lock; the checkpoint is current inside."""
        async with self._locks.hold(uid), self._instance.hold():
            if self._instance.shared:
                await asyncio.to_thread(self._checkpoints.sync)
            yield

    async def prepare(self, ref: ClaimRef, *, deadline: float | None = None) -> PreparedClaim:
        _check(ref, action="prepare")
        if deadline is not None and asyncio.get_running_loop().time() >= deadline:
            raise ClaimError(
                f"prepare claim {ref}: not started within the call's time budget "
                "(too many claims in one call); the kubelet retries",
                claim_uid=ref.uid,
            )
        with (
            _claim_log_context(ref),
            tracer.start_as_current_span("allocation.prepare_claim") as span,
        ):
            span.set_attribute("claim_uid", ref.uid)
            await self._inventory_known(ref)
            replaced_deadline = asyncio.get_running_loop().time() + self._replaced_wait_s
            while True:
                async with self._serialized(ref.uid):
                    previous = self._previous_preparation(ref)
                    if previous is None:
                        with _reporting_forbidden_edits():
                            return await self._prepare_locked(ref, deadline=deadline)
                # Wait outside the locks: the old UID's unprepare (here or in another instance)
                # needs them.
                if asyncio.get_running_loop().time() >= replaced_deadline:
                    raise ClaimError(
                        f"claim {ref}: previous preparation {previous} not yet unprepared",
                        claim_uid=ref.uid,
                    )
                await asyncio.sleep(_POLL_S)

    async def _inventory_known(self, ref: ClaimRef) -> None:
        """Wait, bounded and outside the locks, for the node's first inventory when a new claim
        needs it: a freshly started agent serves (and the kubelet calls) before the discovery
        agent's inventory has reached it. A claim already prepared needs none."""
        if self._inventory.current is not None or self._checkpoints.get(ref.uid) is not None:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._inventory_wait_s
        log.info("claim_waits_for_inventory", wait_s=self._inventory_wait_s)
        while self._inventory.current is None:
            if loop.time() >= deadline:
                raise ClaimError(
                    f"prepare claim {ref.uid}: the node's device inventory is not known yet "
                    f"(none from the discovery agent within {self._inventory_wait_s:g}s)",
                    claim_uid=ref.uid,
                )
            await asyncio.sleep(_POLL_S)

    def _previous_preparation(self, ref: ClaimRef) -> str | None:
        """The UID of an earlier incarnation of this claim that is still prepared, if any."""
        if self._checkpoints.get(ref.uid) is not None:
            return None
        others = self._checkpoints.uids_named(ref.namespace, ref.name)
        return others[0] if others else None

    async def _prepare_locked(self, ref: ClaimRef, *, deadline: float | None) -> PreparedClaim:
        record = self._checkpoints.get(ref.uid)
        if record is not None and (record.namespace, record.name) != (ref.namespace, ref.name):
            raise ClaimUIDMismatchError(
                f"prepare claim {ref}: uid {ref.uid!r} is already prepared for claim "
                f"{record.namespace}/{record.name}",
                claim_uid=ref.uid,
            )
        if record is not None and record.state is ClaimState.PREPARE_COMPLETED:
            if not self._checkpoints.stored(ref.uid):
                # Never answer from memory what the disk no longer holds: a restart would
                # not know the claim. Written back first (its directory too, if gone).
                await self._checkpoint(record)
                log.warning("checkpoint_record_restored")
            if record.cdi_spec is not None and not self._written(record):
                await self._write_spec(record)
            mps = self._mps
            if record.mps is not None and mps is not None and not mps.listening(record.uid):
                await self._start_mps(record)
            log.info("claim_prepare_repeated", devices=len(record.devices))
            self._announce_prepared(record, claim=None)
            return record
        claim: AllocatedClaim | None = None
        if record is None:
            claim = await self._read_claim(ref, deadline=deadline)
            record = self._plan(claim, self._inventory.current)
            if record.partitions:
                self._check_partitions(record)
                await self._put_started(record)
                record = await self._make_partitions(record, claim)
                await self._start_mps(record)
                await self._write_spec(record)
            elif record.mps is not None:
                # A daemon outlives the process: the record naming it is durable first.
                await self._put_started(record)
                await self._start_mps(record)
                await self._write_spec(record)
            elif record.vfio:
                # A driver binding outlives the process: the record naming it is durable first.
                self._check_vfio(record)
                await self._put_started(record)
                await self._bind_vfio(record)
                await self._write_spec(record)
            else:
                # PrepareStarted and the CDI spec may land in either order: a spec without a
                # checkpoint is an orphan that recovery deletes. Only PrepareCompleted must
                # follow both, so the two writes run concurrently.
                await self._start(record)
        elif record.partitions and record.cdi_spec is None:
            # Crashed before its partitions were all made: make the rest (the ones made are
            # found, not made again) and plan the spec with them.
            claim = await self._read_claim(ref, deadline=deadline)
            record = await self._make_partitions(record, claim)
            await self._start_mps(record)
            await self._write_spec(record)
        else:
            # A PrepareStarted record (a crash or failure mid-way) is finished from its stored
            # plan, so the answer stays the same whatever the inventory says now.
            await self._start_mps(record)
            await self._bind_vfio(record)
            await self._write_spec(record)
        record = record.completed()
        await self._checkpoint(record)
        self._crash_point("prepare-completed")
        log.info("claim_prepared", devices=[d.device for d in record.devices])
        self._announce_prepared(record, claim=claim)
        return record

    def _announce_prepared(self, record: PreparedClaim, *, claim: AllocatedClaim | None) -> None:
        """Pods from the claim read by this prepare; None lets the sink find them."""
        if self._announce is not None:
            if claim is None:
                self._announce.prepared(record, pods=None)
            else:
                self._announce.prepared(record, pods=claim.pods, resource=claim.resource)

    async def _start(self, record: PreparedClaim) -> None:
        """PrepareStarted and the CDI spec of a claim without partitions, concurrently. When
        the checkpoint write fails (disk full, read-only) a spec written meanwhile is removed at
        once: nothing half-written is left for the runtime to see before the next start's
        recovery.

        This PrepareStarted is atomic but not fsynced. A killed agent finds it (the page cache
        outlives the process) and finishes the claim from it. Only a power loss can take it,
        and a reboot also wipes the CDI specs in /var/run/cdi, the one side effect it guards.
        The kubelet has not been answered, so the next prepare may plan afresh. Partitions
        outlive a process and are not found without their record, so `_put_started` is
        durable for claims that have them."""
        try:
            await self._start_writes(record)
        except ClaimError:
            if self._checkpoints.get(record.uid) is None:
                try:
                    await self._cdi.remove(record.uid)
                    if self._metadata is not None:
                        await self._metadata.remove(
                            record.uid, record.device_metadata, record.cdi_spec
                        )
                except OSError as exc:  # recovery removes it at the next start
                    log.warning("cdi_spec_orphan_kept", error=str(exc))
            raise

    async def _start_writes(self, record: PreparedClaim) -> None:
        """PrepareStarted, the metadata files and the CDI spec in one trip to a worker thread:
        three small unsynced writes cost less than a thread hop each. A lost checkpoint
        directory is restored by `put`, then the writes go as they would one by one."""
        # Encoded here: in the worker thread, Python work would only contend for the GIL.
        checkpoint, files = encode_record(record), self._spec_files(record)
        with _step("allocation.cdi_write", record.uid):  # PrepareStarted and metadata too
            started, error = await asyncio.to_thread(self._start_files, record, checkpoint, files)
        if started:
            self._checkpoints.put_done(record)
        if isinstance(error, FileNotFoundError):
            await _all_or_first_error(
                self._put_started(record, durable=False), self._write_spec(record)
            )
        elif error is not None:
            raise error

    def _start_files(
        self, record: PreparedClaim, checkpoint: bytes, files: _SpecFiles | None
    ) -> tuple[bool, Exception | None]:
        """Blocking: PrepareStarted (`checkpoint`: the encoded record) and its crash point,
        then `_write_files`; the first failure ends the trip. Whether PrepareStarted is on
        disk, and the failure (a FileNotFoundError: the checkpoint directory is gone)."""
        try:
            self._checkpoints.put_unsynced_blocking(record, checkpoint)
        except FileNotFoundError as exc:
            return False, exc
        except OSError as exc:
            return False, _caused(self._checkpoints.write_error(record, exc), exc)
        self._crash_point("prepare-started")
        return True, None if files is None else self._write_files(record, files)

    def _check_partitions(self, record: PreparedClaim) -> None:
        """Fail the claim before anything is written if its partitions cannot be made."""
        inventory = self._inventory.current
        backend = self._backend
        if self._partitions is None or not self._partitions.supports(backend):
            raise ClaimError(
                f"prepare claim {record.uid}: the {backend} backend cannot make "
                f"partitions (asked for: {', '.join(p.device for p in record.partitions)})",
                claim_uid=record.uid,
            )
        for wanted in record.partitions:
            device, placement = _carved_from(inventory, record.uid, wanted)
            self._partitions.check(
                claim_uid=record.uid, device=device, profile=wanted.profile, placement=placement
            )

    async def _read_claim(self, ref: ClaimRef, *, deadline: float | None) -> AllocatedClaim:
        with _step("allocation.claim_read", ref.uid):
            return await self._claims.read(ref, deadline=deadline)

    def _plan(
        self,
        claim: AllocatedClaim,
        inventory: inventory_pb2.Inventory | None,
        *,
        partitions: dict[str, Partition] | None = None,
    ) -> PreparedClaim:
        with _step("allocation.plan", claim.ref.uid):
            return plan(
                claim,
                inventory,
                driver=self._driver,
                backend=self._backend,
                partitions=partitions,
                metadata_root=self._metadata_root,
                mps_root=self._mps_root,
                vfio_metadata_root=self._vfio_metadata_root,
            )

    async def _checkpoint(self, record: PreparedClaim, *, durable: bool = True) -> None:
        with _step("allocation.checkpoint", record.uid, state=str(record.state)):
            await self._checkpoints.put(record, durable=durable)

    async def _make_partitions(self, record: PreparedClaim, claim: AllocatedClaim) -> PreparedClaim:
        """Make (or find) the claim's partitions, then plan it again with them."""
        with _step("allocation.partition", record.uid):
            return await self._make_partitions_traced(record, claim)

    async def _make_partitions_traced(
        self, record: PreparedClaim, claim: AllocatedClaim
    ) -> PreparedClaim:
        self._check_partitions(record)
        assert self._partitions is not None  # checked above
        inventory = self._inventory.current
        made: dict[str, Partition] = {}
        for wanted in record.partitions:
            device, placement = _carved_from(inventory, record.uid, wanted)
            made[wanted.device] = await self._partitions.create(
                claim_uid=record.uid, device=device, profile=wanted.profile, placement=placement
            )
            self._crash_point("partition-created")
        return self._plan(claim, inventory, partitions=made)

    async def _start_mps(self, record: PreparedClaim) -> None:
        """Start (or adopt) the claim's MPS daemon, after the record naming it is stored."""
        if record.mps is None or self._mps is None:
            return
        await self._mps.ensure(record.uid, record.mps)
        self._crash_point("mps-started")

    def _check_vfio(self, record: PreparedClaim) -> None:
        if self._vfio is None:
            raise ClaimError(
                f"prepare claim {record.uid}: the {self._backend} backend of this node cannot "
                "pass devices through to a virtual machine (sim: run with --sysfs-root of a "
                "sim tree)",
                claim_uid=record.uid,
            )

    async def _bind_vfio(self, record: PreparedClaim) -> None:
        """Bind the claim's devices to vfio-pci, after the record naming them is stored."""
        if not record.vfio:
            return
        self._check_vfio(record)
        assert self._vfio is not None  # checked above
        with _step("allocation.vfio_bind", record.uid):
            await self._vfio.bind(record.uid, record.vfio)
        self._crash_point("vfio-bound")

    async def _put_started(self, record: PreparedClaim, *, durable: bool = True) -> None:
        await self._checkpoint(record, durable=durable)
        self._crash_point("prepare-started")

    def _written(self, record: PreparedClaim, *, verify: bool = False) -> bool:
        """Whether the claim's CDI spec and the metadata files it mounts are all on disk;
        with `verify` (at start), whether the files also hold what the record says."""
        metadata, files = record.device_metadata, self._metadata
        if not self._cdi.exists(record.uid):
            return False
        if (
            verify
            and record.cdi_spec is not None
            and not self._cdi.matches(record.uid, record.cdi_spec)
        ):
            return False
        if not metadata or files is None:
            return True
        if verify:
            return files.matches(record.uid, metadata, record.cdi_spec)
        return files.complete(record.uid, metadata, record.cdi_spec)

    async def _write_spec(self, record: PreparedClaim) -> None:
        """The CDI spec and the metadata files it mounts, in one trip to a worker thread."""
        files = self._spec_files(record)
        if files is None:
            return
        with _step("allocation.cdi_write", record.uid):
            error = await asyncio.to_thread(self._write_files, record, files)
        if error is not None:
            raise error

    def _spec_files(self, record: PreparedClaim) -> _SpecFiles | None:
        """The claim's spec and metadata files, encoded; None for a claim without a spec."""
        if record.cdi_spec is None:
            return None
        metadata, files = record.device_metadata, self._metadata
        return _SpecFiles(
            metadata=files.encoded(record.uid, metadata, record.cdi_spec)
            if metadata and files is not None
            else [],
            spec=encode_spec(record.cdi_spec),
        )

    def _write_files(self, record: PreparedClaim, files: _SpecFiles) -> ClaimError | None:
        """Blocking: the metadata files, then the spec, each followed by its crash point; the
        failure, if any. No runtime reads the spec before the kubelet has the answer, and a
        crash between the two leaves a claim `_written` finds incomplete (a record) or an
        orphan recovery removes (none)."""
        if files.metadata and self._metadata is not None:
            try:
                self._metadata.write_blocking(files.metadata)
            except OSError as exc:
                return _caused(
                    ClaimError(
                        f"prepare claim {record.uid}: writing device metadata under "
                        f"{self._metadata.root}: {exc}",
                        claim_uid=record.uid,
                    ),
                    exc,
                )
            self._crash_point("metadata-written")
        try:
            self._cdi.write_blocking(record.uid, files.spec)
        except OSError as exc:
            path = self._cdi.path(record.uid)
            return _caused(
                ClaimError(
                    f"prepare claim {record.uid}: writing CDI spec {path}: {exc}",
                    claim_uid=record.uid,
                ),
                exc,
            )
        self._crash_point("cdi-written")
        return None

    def _crash_point(self, step: str) -> None:
        """Fault-injection seam: die here, as kill -9 would, when `crash_at` names this step."""
        if self._crash_at == step:
            log.warning("crash_injected", step=step)
            os._exit(CRASH_EXIT_CODE)

    async def unprepare(self, ref: ClaimRef) -> None:
        _check(ref, action="unprepare")
        with (
            _claim_log_context(ref),
            tracer.start_as_current_span("allocation.unprepare_claim"),
        ):
            async with self._serialized(ref.uid):
                record = self._checkpoints.get(ref.uid)
                was_prepared = record is not None
                try:
                    await self._cdi.remove(ref.uid)
                except OSError as exc:
                    raise ClaimError(
                        f"unprepare claim {ref.uid}: removing CDI spec: {exc}", claim_uid=ref.uid
                    ) from exc
                self._crash_point("unprepare-cdi-removed")
                if self._metadata is not None:
                    try:
                        await self._metadata.remove(
                            ref.uid,
                            None if record is None else record.device_metadata,
                            None if record is None else record.cdi_spec,
                        )
                    except OSError as exc:
                        raise ClaimError(
                            f"unprepare claim {ref.uid}: removing device metadata: {exc}",
                            claim_uid=ref.uid,
                        ) from exc
                if self._mps is not None:
                    await self._mps.stop(ref.uid)
                if self._vfio is not None and (record is None or record.vfio):
                    # Without a record: a ledger kept when the checkpoint directory was lost.
                    await self._vfio.release(ref.uid)
                if record is not None and record.partitions and self._partitions is not None:
                    await self._partitions.delete_claim(ref.uid)
                await self._checkpoints.delete(ref.uid)
                log.info("claim_unprepared", was_prepared=was_prepared)
                if self._announce is not None:
                    self._announce.unprepared(ref.uid)

    async def recover(self) -> None:
        """At start: rewrite lost specs of prepared claims, remove specs of unknown claims.

        Under the instance lock: a sibling instance may be between its PrepareStarted and CDI
        writes, and its spec must not be taken for an orphan.
        """
        async with self._instance.hold():
            if self._instance.shared:
                await asyncio.to_thread(self._checkpoints.sync)
            metadata = self._metadata
            temporaries = [
                *self._checkpoints.remove_temporaries(),
                *self._cdi.remove_temporaries(),
                *(metadata.remove_temporaries() if metadata is not None else ()),
            ]
            for path in temporaries:
                log.warning("temporary_file_removed", path=str(path))
            for record in self._checkpoints.records():
                completed = record.state is ClaimState.PREPARE_COMPLETED
                written = self._written(record, verify=True)
                if completed and record.cdi_spec is not None and not written:
                    await self._write_spec(record)
                    log.warning("cdi_spec_regenerated", claim_uid=record.uid)
            for uid in self._cdi.claim_uids():
                if self._checkpoints.get(uid) is None:
                    await self._remove_orphan_spec(uid)
            for uid in metadata.claim_uids() if metadata is not None else ():
                if self._checkpoints.get(uid) is None:
                    await self._remove_orphan_metadata(uid)
            await self._recover_mps()
            await self._recover_vfio()
            await self._remove_orphan_partitions()

    async def _remove_orphan_spec(self, uid: str) -> None:
        """A spec without a record is an orphan, unless the checkpoint directory itself was
        lost: then the kubelet may believe its claim prepared, and its unprepare removes it."""
        if self._checkpoints.lost_at_start:
            log.warning("cdi_spec_kept_without_record", claim_uid=uid)
            return
        await self._cdi.remove(uid)
        log.warning("cdi_spec_orphan_removed", claim_uid=uid)

    async def _remove_orphan_metadata(self, uid: str) -> None:
        """Metadata files without a record (a crash before PrepareStarted, or between the
        spec's removal and the record's); kept when the checkpoint directory was lost."""
        if self._checkpoints.lost_at_start or self._metadata is None:
            log.warning("device_metadata_kept_without_record", claim_uid=uid)
            return
        await self._metadata.remove(uid)
        log.warning("device_metadata_orphan_removed", claim_uid=uid)

    async def _recover_mps(self) -> None:
        """The daemon of every completed claim runs (a daemon that outlived the agent is
        adopted, one that died with it is started again); a daemon no record names (its
        record quarantined) is stopped. A claim left PrepareStarted gets its daemon from the
        kubelet's retry. A daemon that cannot be started fails no start: its claim's next
        prepare says why."""
        if self._mps is None:
            return
        for record in self._checkpoints.records():
            if record.mps is None or record.state is not ClaimState.PREPARE_COMPLETED:
                continue
            try:
                if await self._mps.ensure(record.uid, record.mps):
                    log.warning("mps_daemon_restarted", claim_uid=record.uid)
            except ClaimError as exc:
                log.error("mps_daemon_not_recovered", claim_uid=record.uid, error=str(exc))
        if self._checkpoints.lost_at_start:
            return
        for uid in self._mps.claim_uids():
            if self._checkpoints.get(uid) is None:
                try:
                    await self._mps.stop(uid)
                    log.warning("mps_daemon_orphan_stopped", claim_uid=uid)
                except ClaimError as exc:
                    log.error("mps_daemon_orphan_kept", claim_uid=uid, error=str(exc))

    async def _recover_vfio(self) -> None:
        """Functions of completed claims are on vfio-pci again; those of claims without a
        record go back to their drivers (kept when the checkpoint directory was lost)."""
        if self._vfio is None:
            return
        records = self._checkpoints.records()
        await self._vfio.recover(
            completed={r.uid for r in records if r.state is ClaimState.PREPARE_COMPLETED},
            started={r.uid for r in records if r.state is ClaimState.PREPARE_STARTED},
            keep_orphans=self._checkpoints.lost_at_start,
        )

    async def _remove_orphan_partitions(self) -> None:
        """Partitions of claims without a record: made before a record was quarantined. Kept
        when the checkpoint directory was lost (see `_remove_orphan_spec`)."""
        if self._partitions is None or self._checkpoints.lost_at_start:
            return
        try:
            existing = await self._partitions.partitions()
        except ClaimError as exc:
            log.error("partitions_unreadable", error=str(exc))
            return
        for uid in sorted({p.claim_uid for p in existing}):
            if self._checkpoints.get(uid) is None:
                await self._partitions.delete_claim(uid)
                log.warning("partition_orphan_removed", claim_uid=uid)


def _carved_from(
    inventory: inventory_pb2.Inventory | None, claim_uid: str, wanted: PreparedPartition
) -> tuple[inventory_pb2.Device, int | None]:
    """The device to partition and where: the allocated device itself (anywhere), or the
    parent of an option made on demand, at the option's placement."""
    device = find_device(inventory, wanted.device, claim_uid=claim_uid, pool="")
    option = on_demand_option(device, claim_uid=claim_uid)
    if option is None:
        return device, None
    if option.profile != wanted.profile:
        raise ClaimError(
            f"prepare claim {claim_uid}: device {device.name} is now a {option.profile} "
            f"option, but the claim was planned with {wanted.profile}",
            claim_uid=claim_uid,
        )
    parent = find_device(inventory, option.parent, claim_uid=claim_uid, pool="")
    return parent, option.placement


@contextlib.contextmanager
def _reporting_forbidden_edits() -> Iterator[None]:
    """A security log line and the rejected-edits metric for each edit the allowlist refused
    (a forged or damaged inventory); the claim still fails with the error."""
    try:
        yield
    except allowlist.ForbiddenEditError as exc:
        backend = exc.backend if exc.backend in allowlist.BACKENDS else "unknown"
        for rejected in exc.rejected:
            instruments.REJECTED_EDITS.add(1, {"backend": backend, "kind": rejected.kind})
            log.warning(
                "cdi_edit_rejected",
                security=True,
                backend=backend,
                device=rejected.device,
                kind=rejected.kind,
                edit=rejected.edit,
            )
        raise


def _check(ref: ClaimRef, *, action: str) -> None:
    if not safe_uid(ref.uid):
        raise ClaimError(
            f"{action} claim {ref}: malformed uid {echo.clip(ref.uid, 128)!r}",
            claim_uid=ref.uid,
        )


def _caused(error: ClaimError, cause: OSError) -> ClaimError:
    """`error`, raised later in another thread's stead, with what caused it."""
    error.__cause__ = cause
    return error


def _step(name: str, uid: str, **attributes: str) -> contextlib.AbstractContextManager[Any]:
    """A span of one prepare step, named by the claim's UID."""
    return tracer.start_as_current_span(name, attributes={"claim_uid": uid, **attributes})


def _claim_log_context(ref: ClaimRef) -> contextlib.AbstractContextManager[Any]:
    """The claim's fields on every log line of its work; clipped, as the kubelet sent them."""
    return structlog.contextvars.bound_contextvars(
        claim_uid=echo.clip(ref.uid, 128),
        namespace=echo.clip(ref.namespace, 63),
        claim=echo.clip(ref.name),
    )


def _collect(
    refs: Sequence[ClaimRef], outcomes: Sequence[T | BaseException]
) -> dict[str, T | ClaimError]:
    answers: dict[str, T | ClaimError] = {}
    for ref, outcome in zip(refs, outcomes, strict=True):
        if isinstance(outcome, ClaimError):
            log.warning(
                "claim_failed",
                claim_uid=echo.clip(ref.uid, 128),
                namespace=echo.clip(ref.namespace, 63),
                claim=echo.clip(ref.name),
                error=echo.clip(str(outcome), echo.MAX_ERROR_CHARS),
            )
            answers[ref.uid] = outcome
        elif isinstance(outcome, BaseException):
            raise outcome
        else:
            answers[ref.uid] = outcome
    return answers


async def _all_or_first_error(*steps: Coroutine[Any, Any, None]) -> None:
    """Run `steps` concurrently; wait for all of them, then raise the first failure."""
    outcomes = await asyncio.gather(*steps, return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
