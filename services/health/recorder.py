"""The health KV writer: one `DeviceHealth` record per device of this node.

`set()` gives the records wanted now; `flush()` writes the ones that changed (and rewrites each
unchanged one about every `refresh_s`, at a jittered time so that a fleet started together does
not rewrite together) and deletes records of devices that left. While NATS is down the wanted
records simply wait for the next flush; after every (re)connect the node's keys are resynced.

`guard()` watches the node's keys (`shared.bus.ownkeys`): when a record
written here is emptied, deleted, replaced or refused by the record check (another node's
redirected answer), it is put back at once, not at its next refresh; logged as
`health_record_reasserted` (`security=true`) and counted in the counter the agent passes.

A device passed through to a virtual machine (`Health.PASSTHROUGH`) is recorded UNKNOWN with
cause `passthrough` and code `vfio`, and no taint: the kubelet, which gets the record's state from
the allocation agent, sees Unknown (the host cannot tell its health), and the cause tells it from
an unmonitored device.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import time
from collections.abc import AsyncGenerator, Callable, Iterable, Mapping
from typing import cast

import structlog
from opentelemetry.metrics import Counter

from services.health.policy import PASSTHROUGH, DeviceState, Health, Taint
from shared.bus import codec, kv, ownkeys
from shared.bus.connection import Bus
from shared.errors import BusUnavailableError, MalformedMessageError
from shared.pb.drasuite.v1 import health_pb2
from shared.vendors.parts.observation import Fault

__all__ = [
    "PASSTHROUGH_CODE",
    "PASSTHROUGH_MESSAGE",
    "HealthRecorder",
    "state_from_record",
    "to_record",
]

log = structlog.get_logger(__name__)

_STATES = {
    Health.HEALTHY: health_pb2.HEALTH_STATE_HEALTHY,
    Health.UNHEALTHY: health_pb2.HEALTH_STATE_UNHEALTHY,
    Health.UNKNOWN: health_pb2.HEALTH_STATE_UNKNOWN,
    Health.PASSTHROUGH: health_pb2.HEALTH_STATE_UNKNOWN,
}
_HEALTH = {
    health_pb2.HEALTH_STATE_HEALTHY: Health.HEALTHY,
    health_pb2.HEALTH_STATE_UNHEALTHY: Health.UNHEALTHY,
    health_pb2.HEALTH_STATE_UNKNOWN: Health.UNKNOWN,
}
PASSTHROUGH_CODE = "vfio"
PASSTHROUGH_MESSAGE = (
    "passed through to a virtual machine (bound to vfio-pci): the host does not monitor it "
    "until its claim is unprepared"
)


def to_record(
    state: DeviceState,
    *,
    driver: str,
    node: str,
    pool: str,
    taint: Taint | None,
    taints: Iterable[health_pb2.DeviceTaint] = (),
) -> health_pb2.DeviceHealth:
    """The KV record of `state`; `taint` is the one actually applied (None if taints are off);
    `taints` every taint the agent wants on the device now (its fault taint, a drain)."""
    fault = state.fault
    cause, code = (fault.cause, fault.code) if fault is not None else ("", "")
    message = fault.message if fault is not None else ""
    if state.health is Health.PASSTHROUGH:
        cause, code, message = PASSTHROUGH, PASSTHROUGH_CODE, PASSTHROUGH_MESSAGE
    elif state.health is Health.UNKNOWN and not message:
        message = "device is not monitored"
    return health_pb2.DeviceHealth(
        driver=driver,
        node=node,
        pool=pool,
        device=state.device,
        state=_STATES[state.health],
        cause=cause,
        code=code,
        message=message,
        since_unix_ms=int(state.since * 1000),
        taint=str(taint) if taint is not None else "",
        taints=list(taints),
    )


def state_from_record(record: health_pb2.DeviceHealth, *, now: float) -> DeviceState:
    """What a record left by an earlier run says, to carry faults and since across restarts.

    A `since` that is not a past time (zero, negative, later than `now`: a record no agent
    wrote, or a clock set back) counts from `now`: hysteresis then waits its full time, and
    nothing derived from it (alert times, IDs) leaves the int64 range."""
    since = record.since_unix_ms / 1000 if 0 < record.since_unix_ms <= now * 1000 else now
    health = _HEALTH.get(record.state, Health.UNKNOWN)
    if health is Health.UNKNOWN and record.cause == PASSTHROUGH:
        # Passed through when the earlier run stopped: no fault; the claims say if it still is.
        return DeviceState(device=record.device, health=Health.PASSTHROUGH, since=since)
    fault = Fault(cause=record.cause, code=record.code, message=record.message)
    faulty = health is not Health.HEALTHY and bool(record.cause)
    return DeviceState(
        device=record.device,
        health=health,
        since=since,
        fault=fault if faulty else None,
        fault_since=since if faulty else 0.0,
        taint=Taint.parse(record.taint) if faulty else None,
    )


class HealthRecorder:
    def __init__(
        self,
        bus: Bus,
        *,
        driver: str,
        node: str,
        refresh_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._bus = bus
        self._driver = driver
        self._node = node
        self._refresh_s = refresh_s
        self._clock = clock
        self._wanted: dict[str, health_pb2.DeviceHealth] = {}
        # What the KV holds for each device as far as we know: record bytes without
        # `updated_unix_ms`, and when an unchanged record is rewritten next.
        self._written: dict[str, tuple[bytes, float]] = {}
        self._jitter = random.Random()
        self._stale: set[str] = set()
        self._next_refresh = 0.0
        """When the earliest refresh of a written record is due (0: a flush has work now)."""
        self._synced_epoch = 0
        self._deferred = False
        # flush() and the guard's put-back each read-then-write keys and `_written`.
        self._writing = asyncio.Lock()

    @property
    def prefix(self) -> str:
        return self._bus.names.health_key(self._driver, self._node, "")

    def set(self, records: Mapping[str, health_pb2.DeviceHealth]) -> None:
        self._wanted = dict(records)
        self._next_refresh = 0.0

    @property
    def next_refresh(self) -> float:
        """When the earliest refresh of a written record is due (clock time; inf: none)."""
        return self._next_refresh

    def due(self) -> bool:
        """Whether `flush()` has anything to do: a record given since, a refresh due, a write
        that waits for NATS, or a connection not resynced yet."""
        return (
            self._clock() >= self._next_refresh
            or self._deferred
            or self._synced_epoch != self._bus.epoch
            or not self._bus.connected.is_set()
        )

    async def flush(self, *, device: str | None = None) -> bool:
        """Bring the KV in line with the wanted records (only `device`'s if given).

        True when done; False when NATS is down (the next flush retries).
        """
        async with self._writing:
            return await self._flush(device)

    async def _flush(self, device: str | None) -> bool:
        try:
            if self._synced_epoch != self._bus.epoch or not self._bus.connected.is_set():
                await self._resync()
            if device is not None:
                await self._put_if_changed(device)
                return True
            for name in sorted(self._wanted):
                await self._put_if_changed(name)
            for name in sorted((set(self._written) | self._stale) - set(self._wanted)):
                await self._delete(name)
            self._next_refresh = min((due for _, due in self._written.values()), default=math.inf)
        except BusUnavailableError as exc:
            if not self._deferred:
                log.warning("health_records_deferred", node=self._node, error=str(exc))
            self._deferred = True
            return False
        if self._deferred:
            log.info("health_records_resynced", node=self._node, devices=len(self._wanted))
            self._deferred = False
        return True

    async def guard(self, *, counter: Counter, pace: ownkeys.ReassertPace | None = None) -> None:
        """Eternal: put back each record of ours that another writer replaced or removed."""
        names = self._bus.names
        await ownkeys.OwnKeysGuard(
            self._bus,
            bucket=names.health_bucket,
            keys=names.health_keys(self._driver, self._node),
            restore=self._restore,
            counter=counter,
            records="health",
            pace=pace,
        ).run()

    async def _restore(self, change: kv.KVChange) -> ownkeys.Restored:
        """Put the wanted record back on `change.key` unless it holds the one written last."""
        device = change.key.removeprefix(self.prefix)
        async with self._writing:
            written_here = device in self._written and device in self._wanted
            if self._synced_epoch != self._bus.epoch or not written_here:
                # Not written on this connection yet (the next flush puts it), or not wanted.
                return ownkeys.NOTHING
            if not change.rejected and self._holds(change.value, device):
                return ownkeys.NOTHING  # our own put, seen by the watch
            found = await self._bus.kv_get(self._bus.names.health_bucket, change.key)
            # An unsigned record taken in accept mode is ours from before we signed: sign it.
            if change.rejected != "unsigned" and self._holds(found, device):
                return ownkeys.NOTHING  # already put again (by a flush) since that change
            self._written.pop(device)
            await self._put_if_changed(device)
        reason = "rejected" if change.rejected else "deleted" if found is None else "differs"
        log.warning("health_record_reasserted", security=True, key=change.key, reason=reason,
                    refused=change.rejected)  # fmt: skip
        return ownkeys.Restored(reason)

    def _holds(self, data: bytes | None, device: str) -> bool:
        """Whether `data` is the record last written for `device`, whenever it was stamped."""
        written = self._written.get(device)
        if data is None or written is None:
            return False
        try:
            found = codec.decode(health_pb2.DeviceHealth, data, subject=device)
            ours = codec.decode(health_pb2.DeviceHealth, written[0], subject=device)
        except MalformedMessageError:
            return False
        found.ClearField("updated_unix_ms")
        return found == ours

    async def _resync(self) -> None:
        """After a (re)connect: forget what we wrote, learn the keys that exist."""
        epoch = self._bus.epoch
        existing = await self.existing()
        self._written.clear()
        self._stale = set(existing)
        self._synced_epoch = epoch

    async def existing(self) -> dict[str, health_pb2.DeviceHealth]:
        """The node's records now in the KV, by device (undecodable ones count, as empty)."""
        if not self._bus.connected.is_set():
            raise BusUnavailableError("nats is not connected", subject=self.prefix)
        names = self._bus.names
        keys = names.health_keys(self._driver, self._node)
        found: dict[str, health_pb2.DeviceHealth] = {}
        try:
            async with asyncio.timeout(self._bus.settings.request_timeout_s * 2):
                # watch() is an async generator: closing it stops the server-side watcher.
                watch = cast(
                    AsyncGenerator[kv.KVChange, None],
                    kv.watch(self._bus, bucket=names.health_bucket, keys=keys),
                )
                async with contextlib.aclosing(watch) as changes:
                    async for change in changes:
                        if change.synced:
                            break
                        if change.value is not None and change.key.startswith(self.prefix):
                            found[change.key.removeprefix(self.prefix)] = self._decode(change)
        except TimeoutError as exc:
            raise BusUnavailableError("listing health records timed out", subject=keys) from exc
        return found

    def _decode(self, change: kv.KVChange) -> health_pb2.DeviceHealth:
        try:
            return codec.decode(health_pb2.DeviceHealth, change.value or b"", subject=change.key)
        except MalformedMessageError:
            return health_pb2.DeviceHealth()

    async def _put_if_changed(self, device: str) -> None:
        record = self._wanted.get(device)
        if record is None:
            return
        blob = codec.encode(record)
        now = self._clock()
        written = self._written.get(device)
        if written is not None and written[0] == blob and now < written[1]:
            return
        stamped = health_pb2.DeviceHealth()
        stamped.CopyFrom(record)
        stamped.updated_unix_ms = int(now * 1000)
        key = self._bus.names.health_key(self._driver, self._node, device)
        await self._bus.kv_put(self._bus.names.health_bucket, key, codec.encode(stamped))
        # A refresh comes uniformly 0.5-1.5 x refresh_s after the last one (the mean stays
        # refresh_s); the first after a change anywhere within refresh_s, so that records
        # written together (a fleet's start) spread over the whole period at once.
        refreshed = written is not None and written[0] == blob
        spread = 0.5 + self._jitter.random() if refreshed else self._jitter.random()
        self._written[device] = (blob, now + self._refresh_s * spread)
        self._stale.discard(device)
        if written is None or written[0] != blob:
            log.debug("health_recorded", node=self._node, device=device, state=record.state)

    async def _delete(self, device: str) -> None:
        key = self._bus.names.health_key(self._driver, self._node, device)
        await self._bus.kv_delete(self._bus.names.health_bucket, key)
        self._written.pop(device, None)
        self._stale.discard(device)
        log.info("health_record_deleted", node=self._node, device=device)
