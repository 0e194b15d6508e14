"""The prepared-claims writer: one `PreparedClaim` per claim prepared on this node, in the
`dra_claims` KV (key `<driver>.<node>.<claim uid>`), for the health agent's pod attribution and
`dractl claims`.

`prepared()` and `unprepared()` only record what is wanted and return at once: a prepare never
waits on NATS, nor fails because of it. The `claim-publisher` task writes what changed; while
NATS is down the wanted state waits, and after every (re)connect the node's keys are resynced
(stale keys deleted, missing or different ones put). At start `seed()` re-asserts the claims of
the checkpoint. Pods come from the claim's `status.reservedFor` as read by the prepare; when a
prepare did not read the claim (a repeat, a restart), the pods are kept from the KV value, or
looked up (a claim GET) by this task, off the prepare path.

`guard()` watches the node's keys (`shared.bus.ownkeys`): a claim's
value written here that is emptied, deleted, replaced or refused by the record check (another
node's redirected answer) is put back at once; logged as `prepared_claim_reasserted`
(`security=true`), counted in `dra_prepared_claims_reasserted_total{reason}`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, cast

import structlog

from services.allocation import instruments
from services.allocation.claim.checkpoint import PreparedClaim
from services.allocation.claim.claims import AllocatedClaim, ClaimRef, PodRef
from shared.backoff import Backoff
from shared.bus import codec, kv, ownkeys
from shared.bus.connection import Bus
from shared.cancellation import reraise_if_cancelling
from shared.errors import BusUnavailableError, ClaimError, MalformedMessageError
from shared.pb.drasuite.v1 import claim_pb2

__all__ = ["ClaimReading", "PodLookup", "PreparedClaimPublisher", "lookup_with", "to_message"]

log = structlog.get_logger(__name__)

_PIPELINE = 64
"""Claims whose KV writes are in flight at once."""

PodLookup = Callable[[ClaimRef], Awaitable[Sequence[PodRef]]]
"""The pods a claim is reserved for now (a claim GET); raises ClaimError when it cannot tell."""


class ClaimReading(Protocol):
    """What `lookup_with` needs: `claims.ClaimReader`."""

    async def read(self, ref: ClaimRef) -> AllocatedClaim: ...


def lookup_with(reader: ClaimReading) -> PodLookup:
    """Pods looked up by reading the claim as a prepare does."""

    async def pods(ref: ClaimRef) -> Sequence[PodRef]:
        return (await reader.read(ref)).pods

    return pods


def to_message(
    record: PreparedClaim, *, node: str, pods: Sequence[PodRef], prepared_unix_ms: int
) -> claim_pb2.PreparedClaim:
    """The KV value of a prepared claim (pure). A device the claim bound to vfio-pci is marked
    `DEVICE_PASSTHROUGH_VFIO`, so that the health agent stops judging it by its monitor."""
    vfio = {v.device for v in record.vfio}
    return claim_pb2.PreparedClaim(
        driver=record.driver,
        node=node,
        claim_uid=record.uid,
        namespace=record.namespace,
        name=record.name,
        devices=[
            claim_pb2.PreparedClaimDevice(
                request_names=list(device.request_names),
                pool=device.pool,
                device=device.device,
                share_id=device.share_id or "",
                cdi_device_ids=list(device.cdi_device_ids),
                passthrough=(
                    claim_pb2.DEVICE_PASSTHROUGH_VFIO
                    if device.device in vfio
                    else claim_pb2.DEVICE_PASSTHROUGH_NONE
                ),
            )
            for device in record.devices
        ],
        pods=[claim_pb2.ClaimPod(namespace=p.namespace, name=p.name, uid=p.uid) for p in pods],
        state=claim_pb2.PREPARED_CLAIM_STATE_PREPARED,
        prepared_unix_ms=prepared_unix_ms,
    )


class PreparedClaimPublisher:
    def __init__(
        self,
        bus: Bus,
        *,
        driver: str,
        node: str,
        lookup: PodLookup,
        clock: Callable[[], float] = time.time,
        quiet: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """`quiet`: awaited before each batch of writes (`hot_path.KubeletCalls.quiet`)."""
        self._bus = bus
        self._quiet = quiet
        self._driver = driver
        self._node = node
        self._lookup = lookup
        self._clock = clock
        self._records: dict[str, PreparedClaim] = {}
        self._pods: dict[str, tuple[PodRef, ...]] = {}
        self._since_ms: dict[str, int] = {}
        self._dirty: set[str] = set()
        """Claim UIDs whose key must be put (prepared) or deleted (not prepared any more)."""
        self._lookups: set[str] = set()
        """Claim UIDs whose pods are to be read from the API (a repeat prepare, a restart)."""
        self._written: dict[str, bytes] = {}
        self._synced_epoch = -1
        # A write and the guard's put-back each read-then-write a key and `_written`.
        self._writing = asyncio.Lock()
        self._changed = asyncio.Event()
        self.synced = asyncio.Event()
        """Set whenever the KV holds exactly the wanted state (tests, readiness of the view)."""

    def prepared(
        self,
        record: PreparedClaim,
        *,
        pods: Sequence[PodRef] | None,
        resource: Mapping[str, Any] | None = None,
    ) -> None:
        """`record` completed its prepare; `pods` from the claim it read, None when not read."""
        uid = record.uid
        self._records[uid] = record
        self._since_ms.setdefault(uid, int(self._clock() * 1000))
        if pods is not None:
            self._pods[uid] = tuple(pods)
            self._lookups.discard(uid)
        else:
            self._lookups.add(uid)
        self._mark(uid)

    def unprepared(self, uid: str) -> None:
        if self._records.pop(uid, None) is None and uid not in self._written:
            return
        self._pods.pop(uid, None)
        self._since_ms.pop(uid, None)
        self._lookups.discard(uid)
        self._mark(uid)

    def seed(self, records: Iterable[PreparedClaim]) -> None:
        """At start: the completed claims of the checkpoint (pods from the KV or looked up)."""
        for record in records:
            self.prepared(record, pods=None)

    def _mark(self, uid: str) -> None:
        self._dirty.add(uid)
        self.synced.clear()
        self._changed.set()

    async def run(self) -> None:
        """Eternal: resync after each (re)connect, then write changes as they come."""
        backoff = Backoff(initial_s=0.2, max_s=5.0)
        while True:
            await self._bus.connected.wait()
            epoch = self._bus.epoch
            self._changed.clear()
            try:
                if epoch != self._synced_epoch:
                    await self._resync()
                    self._synced_epoch = epoch
                await self._look_up_pods()
                await self._flush()
                reraise_if_cancelling()
            except BusUnavailableError as exc:
                delay = backoff.next_delay()
                log.warning("prepared_claims_write_failed", error=str(exc), retry_in_s=delay)
                await asyncio.sleep(delay)
                continue
            backoff.reset()
            if not self._dirty:
                self.synced.set()
            await self._wait_for_change(epoch)

    async def guard(self, *, pace: ownkeys.ReassertPace | None = None) -> None:
        """Eternal: put back each claim value of ours that another writer replaced or removed."""
        names = self._bus.names
        await ownkeys.OwnKeysGuard(
            self._bus,
            bucket=names.claims_bucket,
            keys=names.claim_keys(self._driver, self._node),
            restore=self._restore,
            counter=instruments.PREPARED_CLAIMS_REASSERTED,
            records="prepared_claims",
            pace=pace,
        ).run()

    async def _restore(self, change: kv.KVChange) -> ownkeys.Restored:
        """Put the value written last back on `change.key` unless the key holds it."""
        prefix = self._bus.names.claim_keys(self._driver, self._node).removesuffix("*")
        uid = change.key.removeprefix(prefix)
        async with self._writing:
            written = self._written.get(uid)
            if self._synced_epoch != self._bus.epoch or uid in self._dirty:
                return ownkeys.NOTHING  # run() is about to write it (or resync) anyway
            if written is None or uid not in self._records:
                return ownkeys.NOTHING  # not written on this connection, or unprepared
            if not change.rejected and change.value == written:
                return ownkeys.NOTHING  # our own put, seen by the watch
            found = await self._bus.kv_get(self._bus.names.claims_bucket, change.key)
            # An unsigned value taken in accept mode is ours from before we signed: sign it.
            if change.rejected != "unsigned" and found == written:
                return ownkeys.NOTHING  # already put again since that change
            await self._bus.kv_put(self._bus.names.claims_bucket, change.key, written)
        reason = "rejected" if change.rejected else "deleted" if found is None else "differs"
        log.warning("prepared_claim_reasserted", security=True, claim_uid=uid, reason=reason,
                    refused=change.rejected)  # fmt: skip
        return ownkeys.Restored(reason)

    async def _wait_for_change(self, epoch: int) -> None:
        waiters = [
            asyncio.ensure_future(self._changed.wait()),
            asyncio.ensure_future(self._bus.wait_epoch_after(epoch)),
        ]
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
            await asyncio.gather(*waiters, return_exceptions=True)

    async def _resync(self) -> None:
        """Compare the node's keys with the wanted state: all differing keys become dirty."""
        existing = await self._existing()
        self._written = {}
        for uid, message in existing.items():
            seeded = uid in self._records and uid not in self._pods
            if seeded and message is not None and message.claim_uid == uid:
                # A restart: the KV kept what this agent wrote; no claim GET needed.
                self._pods[uid] = tuple(
                    PodRef(namespace=p.namespace, name=p.name, uid=p.uid) for p in message.pods
                )
                self._since_ms[uid] = message.prepared_unix_ms or self._since_ms[uid]
                self._lookups.discard(uid)
            if message is not None and uid in self._records:
                self._written[uid] = codec.encode(message)
        self._dirty |= set(existing) | set(self._records)

    async def _existing(self) -> dict[str, claim_pb2.PreparedClaim | None]:
        """The node's keys now in the KV, by claim UID (None for a value that does not decode)."""
        names = self._bus.names
        keys = names.claim_keys(self._driver, self._node)
        prefix = keys.removesuffix("*")
        found: dict[str, claim_pb2.PreparedClaim | None] = {}
        try:
            async with asyncio.timeout(self._bus.settings.request_timeout_s * 2):
                # watch() is an async generator: closing it stops the server-side watcher.
                watch = cast(
                    AsyncGenerator[kv.KVChange, None],
                    kv.watch(self._bus, bucket=names.claims_bucket, keys=keys),
                )
                async with contextlib.aclosing(watch) as changes:
                    async for change in changes:
                        if change.synced:
                            break
                        if change.value is not None and change.key.startswith(prefix):
                            # Unsigned (written before signatures): rewritten, signed.
                            unsigned = self._bus.records.on and not change.signed
                            found[change.key.removeprefix(prefix)] = (
                                None if unsigned else _decoded(change)
                            )
        except TimeoutError as exc:
            raise BusUnavailableError("listing prepared claims timed out", subject=keys) from exc
        return found

    async def _look_up_pods(self) -> None:
        for uid in sorted(self._lookups):
            record = self._records.get(uid)
            if record is None:
                continue
            ref = ClaimRef(namespace=record.namespace, name=record.name, uid=uid)
            try:
                pods = tuple(await self._lookup(ref))
            except ClaimError as exc:
                log.warning("prepared_claim_pods_unknown", claim_uid=uid, error=str(exc))
                pods = ()
            if uid in self._records:  # not unprepared meanwhile
                self._pods[uid] = pods
                self._lookups.discard(uid)
                self._dirty.add(uid)

    async def _flush(self) -> None:
        """Pipelined: the puts and deletes of up to `_PIPELINE` claims go out together and
        their acks are awaited together (one flush to NATS instead of one per claim)."""
        for _ in range(0, len(self._dirty), _PIPELINE):  # what is dirty now; later: next run
            if self._quiet is not None:
                await self._quiet()
            batch = [u for u in sorted(self._dirty) if self._ready(u)][:_PIPELINE]
            if not batch:
                return
            # Taken off first: a prepare or unprepare during the write marks it again.
            self._dirty.difference_update(batch)
            async with self._writing:
                outcomes = await asyncio.gather(
                    *(self._write(uid) for uid in batch), return_exceptions=True
                )
            failures = [(u, o) for u, o in zip(batch, outcomes, strict=True) if o is not None]
            self._dirty.update(u for u, o in failures if isinstance(o, BusUnavailableError))
            if failures:
                raise failures[0][1]

    def _ready(self, uid: str) -> bool:
        """Whether the claim's key can be written: a prepared claim's pods are known."""
        return uid not in self._records or uid in self._pods

    async def _write(self, uid: str) -> None:
        """Put or delete the claim's key (the caller holds `_writing`)."""
        bucket = self._bus.names.claims_bucket
        key = self._bus.names.claim_key(self._driver, self._node, uid)
        record = self._records.get(uid)
        if record is None:
            await self._bus.kv_delete(bucket, key)
            self._written.pop(uid, None)
            log.debug("prepared_claim_deleted", claim_uid=uid)
            return
        message = to_message(
            record,
            node=self._node,
            pods=self._pods.get(uid, ()),
            prepared_unix_ms=self._since_ms[uid],
        )
        blob = codec.encode(message)
        if self._written.get(uid) != blob:
            await self._bus.kv_put(bucket, key, blob)
            self._written[uid] = blob
            log.debug("prepared_claim_written", claim_uid=uid, pods=len(message.pods))


def _decoded(change: kv.KVChange) -> claim_pb2.PreparedClaim | None:
    try:
        return codec.decode(claim_pb2.PreparedClaim, change.value or b"", subject=change.key)
    except MalformedMessageError:
        return None
