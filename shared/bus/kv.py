"""Watching a KV bucket across NATS outages: current values first, then every change.

`watch()` yields `KVChange`s forever. After a reconnect it restarts the watch, which replays the
latest value of every key, so a consumer that applies changes idempotently converges.

A consumer can also go while the connection stays up: on a JetStream cluster the R1 consumer
lives on one server, which may die while this client is connected to another, and anyone may
delete it. The consumer sends an idle heartbeat (`--nats-watch-heartbeat-s`) whenever it had
nothing to deliver; a watch that hears nothing, neither entry nor heartbeat, for
`_STALL_HEARTBEATS` heartbeats while connected logs `kv_watch_stalled` and restarts at once,
replaying as after a reconnect.

Each (re)start creates a *named* push consumer through
`$JS.API.CONSUMER.CREATE.<stream>.<name>.<filter>`, the one consumer-create form whose name
and filter are in the subject, so nats-server can allow a node agent to create exactly its own
consumers on its own keys (`services.natsauth.permissions`). A node agent's consumer has
one name per instance slot, `<role>-<node>-<purpose>` and `...-<purpose>1`: a (re)start takes
the first slot whose consumer nobody listens to, deleting the one left there (its own, so the
new one replays from scratch), and passes over a slot a live sibling holds (the other pod of a
rolling update with surge), so two processes never take each other's consumer. Nobody else may
create, read or delete them. Other buses (operator, tests) use random names. It delivers to
this Bus's own inbox; the server removes it once nobody listens.

An entry counts only when it came from this watch's consumer on this stream and its key is one
the watch asked for: someone else's consumer can be made to deliver into our inbox. An entry
that is JetStream's own answer (`origin`) was not put by a client but redirected into the bucket
as the reply of someone's request. Both are dropped and logged (`kv_entry_dropped`,
`security=true`), as nats-server can refuse neither.

With `--bus-signatures` on, every entry also goes through `Records.check`: one its key's owner
did not sign (an emptied entry left by a redirected 404, another node's value, a bad or expired
certificate) is dropped, logged and counted the same way. A watch of the owner's own keys asks
for those too (`rejected=True`): it gets a change with `rejected` set, and puts its value back;
in accept mode also for an unsigned entry on its key (written before it signed), to sign it.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import nats.errors
import nats.js.errors
import structlog
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import api
from nats.js.kv import KV_DEL, KV_OP, KV_PURGE, KeyValue

from shared import telemetry
from shared.backoff import Backoff
from shared.bus import origin
from shared.bus.connection import Bus
from shared.bus.subjects import INSTANCE_SLOTS
from shared.cancellation import reraise_if_cancelling
from shared.errors import BusUnavailableError, ProgrammingError

__all__ = ["KVChange", "checked", "consumer_name", "watch"]

_WATCH_FAILED = (BusUnavailableError, nats.errors.Error, TimeoutError)
_MARKER_REASON = "Nats-Marker-Reason"
_INACTIVE_THRESHOLD_S = 60.0
_CONSUMER_TAKEN = frozenset({10013, 10148})
"""JetStream's error codes for a create whose name another consumer holds: "consumer name
already in use" and "consumer already exists" (another config). Either way a sibling won."""
_INFO_TIMEOUT_S = 1.0
"""How long a watch's start asks after a slot's consumer: one on a dead server never answers."""
# Missed heartbeats before a watch counts its consumer as lost (nats.go's ordered consumer
# waits as many): one late heartbeat is not a lost consumer.
_STALL_HEARTBEATS = 3

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class KVChange:
    key: str
    # None when the key was deleted or purged.
    value: bytes | None
    revision: int
    # True on the marker that ends the replay of current values after each (re)start.
    synced: bool = False
    # The writer's W3C trace-context headers (only those; `telemetry.carried`).
    trace: telemetry.Carrier = ()
    # True for a current value replayed after a (re)start, not a change seen as it happened.
    replayed: bool = False
    # Why the entry was refused (`shared.bus.signing.REASONS`); only for `watch(rejected=True)`,
    # whose caller owns the key and puts its value back. `value` is then None.
    rejected: str = ""
    # True when the entry was signed by its key's owner (signatures on).
    signed: bool = False


_SYNCED = KVChange(key="", value=None, revision=0, synced=True)


@dataclass(slots=True)
class _Watcher:
    subscription: Subscription
    queue: asyncio.Queue[Msg]
    replay: int
    """How many entries the consumer had to replay when it was created (0: synced at once)."""
    consumer: str


@dataclass(frozen=True, slots=True)
class _Source:
    """Where this watch's entries come from: the stream, the consumer, the keys' filter."""

    stream: str
    consumer: str
    prefix: str
    keys: str

    def admits(self, msg: Msg) -> bool:
        meta = msg.metadata
        if meta.stream != self.stream or meta.consumer != self.consumer:
            return False
        return msg.subject.startswith(self.prefix) and _matches(
            msg.subject[len(self.prefix) :], self.keys
        )


def _matches(key: str, pattern: str) -> bool:
    """NATS subject matching of a key against a filter with `*` and `>`."""
    tokens, wanted = key.split("."), pattern.split(".")
    for index, part in enumerate(wanted):
        if part == ">":
            return len(tokens) > index
        if index >= len(tokens) or (part != "*" and part != tokens[index]):
            return False
    return len(tokens) == len(wanted)


def consumer_name(bus: Bus, purpose: str, slot: int = 0) -> str:
    """The exact name of a node agent's watch in instance slot `slot`; "" for a bus without a
    node (random names)."""
    if bus.component and bus.node:
        return bus.names.consumer(bus.component, bus.node, purpose, slot)
    return ""


class _SlotsTaken(BusUnavailableError):
    """Every instance slot's consumer is in use by a live process: a third instance waits."""


async def _start(bus: Bus, *, bucket: str, keys: str, purpose: str) -> _Watcher:
    """Start a watch on a fresh consumer. A node agent takes the first instance slot whose
    consumer no live process listens to: its own of a previous start, or a dead process's, is
    deleted (a new one replays anew); one still bound to a listener is a sibling's (the other
    pod of a rolling update), which it leaves alone and takes the next slot."""
    stream = bus.names.kv_stream(bucket)
    await bus.kv(bucket)
    if not (bus.node and bus.component):
        return await _create(bus, bucket=bucket, keys=keys, name=f"w{secrets.token_hex(8)}")
    for slot in range(INSTANCE_SLOTS):
        name = consumer_name(bus, purpose, slot)
        if await _bound_to_a_listener(bus, stream, name):
            continue
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await bus.js.delete_consumer(stream, name)
        try:
            return await _create(bus, bucket=bucket, keys=keys, name=name)
        except nats.js.errors.BadRequestError as exc:
            if exc.err_code not in _CONSUMER_TAKEN:
                raise
            # A sibling made it between our look and our create: the next slot.
    raise _SlotsTaken(
        f"watch {bucket}: every consumer slot of {purpose!r} is in use by a live process",
        subject=stream,
    )


async def _bound_to_a_listener(bus: Bus, stream: str, name: str) -> bool:
    """Whether a live process listens to the consumer `name`. One that does not exist, or
    whose server does not answer (it died with the consumer on it), has nobody to lose."""
    try:
        info = await bus.js.consumer_info(stream, name, timeout=_INFO_TIMEOUT_S)
    except (nats.js.errors.APIError, nats.errors.TimeoutError, nats.errors.NoRespondersError):
        return False  # NotFoundError included
    return bool(info.push_bound)


async def _create(bus: Bus, *, bucket: str, keys: str, name: str) -> _Watcher:
    nc, js, names = bus.nc, bus.js, bus.names
    stream = names.kv_stream(bucket)
    queue: asyncio.Queue[Msg] = asyncio.Queue()

    async def enqueue(msg: Msg) -> None:
        queue.put_nowait(msg)

    deliver = nc.new_inbox()
    # Subscribed before the consumer exists, so no delivery can come before the listener.
    subscription = await nc.subscribe(deliver, cb=enqueue)
    config = api.ConsumerConfig(
        name=name,
        filter_subject=names.kv_subject(bucket, keys),
        deliver_subject=deliver,
        deliver_policy=api.DeliverPolicy.LAST_PER_SUBJECT,
        ack_policy=api.AckPolicy.NONE,
        max_deliver=1,
        mem_storage=True,
        num_replicas=1,
        inactive_threshold=_INACTIVE_THRESHOLD_S,
        idle_heartbeat=bus.settings.watch_heartbeat_s,
    )
    try:
        info = await js.add_consumer(stream, config=config)
    except BaseException:
        with contextlib.suppress(nats.errors.Error, TimeoutError):
            await subscription.unsubscribe()
        raise
    delivered = info.delivered.consumer_seq if info.delivered is not None else 0
    replay = (info.num_pending or 0) + (delivered or 0)
    return _Watcher(subscription, queue, replay=replay, consumer=name)


def _change(
    bus: Bus, msg: Msg, *, source: _Source, replayed: bool, rejected: bool
) -> KVChange | None:
    headers = msg.headers or {}
    key = msg.subject[len(source.prefix) :]
    revision = msg.metadata.sequence.stream
    # The consumer's own delivery has reply `$JS.ACK...`: judge the entry by headers and data.
    if origin.is_jetstream_reply(reply="", headers=headers, data=msg.data):
        _dropped(msg, reason="jetstream_reply")
        if rejected and bus.records.owns(msg.subject):
            return KVChange(key=key, value=None, revision=revision, rejected="jetstream_reply")
        return None
    stored_at = msg.metadata.timestamp.timestamp() if msg.metadata.timestamp else None
    check = bus.records.check(msg.subject, msg.data or b"", headers, stored_at=stored_at)
    if not check.ok:
        if rejected:
            return KVChange(key=key, value=None, revision=revision, rejected=check.reason)
        return None
    if rejected and check.writer is None and bus.records.on and bus.records.resign(msg.subject):
        # Taken unsigned (accept mode: written before this agent signed): its owner signs it.
        return KVChange(key=key, value=None, revision=revision, rejected="unsigned")
    operation = headers.get(KV_OP) or (
        KV_PURGE if headers.get(_MARKER_REASON) in ("MaxAge", "Purge", "Remove") else None
    )
    deleted = operation in (KV_DEL, KV_PURGE)
    return KVChange(
        key=key,
        value=None if deleted else msg.data,
        revision=revision,
        trace=telemetry.carried(headers),
        replayed=replayed,
        signed=check.writer is not None,
    )


async def watch(
    bus: Bus, *, bucket: str, keys: str, purpose: str = "watch", rejected: bool = False
) -> AsyncIterator[KVChange]:
    """Yield changes of `keys` in `bucket` forever, resubscribing after reconnects and when
    the consumer is lost (no entry nor heartbeat for `_STALL_HEARTBEATS` heartbeats).
    `purpose` tells two watches of one bucket in one process apart (`WATCH_PURPOSES`).
    `rejected`: also yield entries refused by `Records.check` (flagged `rejected`), for the
    owner of the keys, which puts its value back."""
    name = consumer_name(bus, purpose)
    held = (bus.names.kv_stream(bucket), name)
    if name and held in bus.consumers_held:
        raise ProgrammingError(f"two watches of {bucket} for {purpose!r} in one process")
    bus.consumers_held.add(held)
    try:
        async for change in _watch(
            bus, bucket=bucket, keys=keys, purpose=purpose, rejected=rejected
        ):
            yield change
    finally:
        bus.consumers_held.discard(held)


async def _watch(
    bus: Bus, *, bucket: str, keys: str, purpose: str, rejected: bool
) -> AsyncIterator[KVChange]:
    backoff = Backoff(initial_s=0.1, max_s=5.0)
    names = bus.names
    prefix = names.kv_subject(bucket, "")
    stall_s = _STALL_HEARTBEATS * bus.settings.watch_heartbeat_s
    loop = asyncio.get_running_loop()
    while True:
        await bus.connected.wait()
        epoch = bus.epoch
        try:
            watcher = await _start(bus, bucket=bucket, keys=keys, purpose=purpose)
            reraise_if_cancelling()
        except (*_WATCH_FAILED, nats.js.errors.Error) as exc:
            await _pause_after(exc, bucket=bucket, backoff=backoff)
            continue
        backoff.reset()
        source = _Source(names.kv_stream(bucket), watcher.consumer, prefix=prefix, keys=keys)
        reconnected = asyncio.ensure_future(bus.wait_epoch_after(epoch))
        update: asyncio.Future[Msg] | None = None
        try:
            if watcher.replay == 0:
                yield _SYNCED
            synced = watcher.replay == 0
            heard_at = loop.time()
            while True:
                if update is None:
                    update = asyncio.ensure_future(watcher.queue.get())
                waiting: set[asyncio.Future[Any]] = {update, reconnected}
                done, _ = await asyncio.wait(
                    waiting, timeout=stall_s, return_when=asyncio.FIRST_COMPLETED
                )
                if reconnected in done:
                    break
                if not done:
                    if not bus.connected.is_set():
                        continue  # no heartbeat can come: the reconnect restarts the watch
                    waited_s = round(loop.time() - heard_at, 1)
                    log.warning("kv_watch_stalled", bucket=bucket, waited_s=waited_s)
                    break
                msg = update.result()
                update = None
                heard_at = loop.time()
                if not msg.reply.startswith("$JS.ACK."):
                    continue  # a heartbeat, or not of the consumer (no metadata): no entry
                if not source.admits(msg):
                    _dropped(msg, reason="not_this_watch")
                    continue  # nor its pending count: another consumer's delivery
                change = _change(bus, msg, source=source, replayed=not synced, rejected=rejected)
                if change is not None:
                    yield change
                if not synced and msg.metadata.num_pending == 0:
                    synced = True
                    yield _SYNCED
        finally:
            reconnected.cancel()
            if update is not None:
                update.cancel()  # also when the caller closes the generator mid-wait
            with contextlib.suppress(nats.errors.Error, TimeoutError):
                await watcher.subscription.unsubscribe()


class _CheckedKeyValue(KeyValue):
    """A bucket whose `get` takes only what `Records.check` takes (`Bus.checked_get`)."""

    def __init__(self, bus: Bus, bucket: str) -> None:
        stream, pre = bus.names.kv_stream(bucket), bus.names.kv_subject(bucket, "")
        super().__init__(name=bucket, stream=stream, pre=pre, js=bus.js, direct=True)
        self._bus = bus
        self._bucket = bucket

    async def get(
        self, key: str, revision: int | None = None, validate_keys: bool = True
    ) -> KeyValue.Entry:
        if revision is not None:
            raise ProgrammingError("a checked bucket reads the current value only")
        data = await self._bus.checked_get(self._bucket, key)
        if data is None:
            raise nats.js.errors.KeyNotFoundError
        return KeyValue.Entry(bucket=self._bucket, key=key, value=data, revision=None,
                              delta=None, created=None, operation=None)  # fmt: skip


def checked(bus: Bus, bucket: str, store: KeyValue) -> KeyValue:
    """`store` (a bucket bound for reading, as dractl does) whose values go through the Bus's
    record check when signatures are on; `store` itself when they are off."""
    return _CheckedKeyValue(bus, bucket) if bus.records.on else store


def _dropped(msg: Msg, *, reason: str) -> None:
    log.warning("kv_entry_dropped", subject=msg.subject, reason=reason, security=True)


async def _pause_after(exc: Exception, *, bucket: str, backoff: Backoff) -> None:
    """A watch failed to start: log it and back off before the next try."""
    reraise_if_cancelling()
    log.warning("kv_watch_failed", bucket=bucket, error=str(exc) or type(exc).__name__)
    await backoff.sleep()
