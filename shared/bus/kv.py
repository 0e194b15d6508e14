"""Watching a KV bucket across NATS outages: current values first, then every change.

`watch()` yields `KVChange`s forever. After a reconnect it restarts the watch, which replays the
latest value of every key, so a consumer that applies changes idempotently converges.

A node agent (a Bus of the discovery, allocation or health role) watches only its own keys, and
does so without a JetStream consumer: `shared.bus.kvfollow`. Every other bus (the operator's, the
auth service's quota auditor, tests) watches through a consumer of its own, as below.

Each (re)start creates a push consumer: the quota auditor's is named
`auditor-<replica>-watch` (`Names.consumer`), the one name its permissions let it create, and it
deletes the one a previous start left; others take a random name. A consumer can go while the
connection stays up: on a JetStream cluster the R1 consumer lives on one server, which may die
while this client is connected to another, and anyone allowed may delete it. The consumer sends
an idle heartbeat (`--nats-watch-heartbeat-s`) whenever it had nothing to deliver; a watch that
hears nothing, neither entry nor heartbeat, for `_STALL_HEARTBEATS` heartbeats while connected
logs `kv_watch_stalled` and restarts at once, replaying as after a reconnect. It delivers to
this Bus's own inbox; the server removes it once nobody listens.

An entry counts only when it came from this watch's consumer on this stream and its key is one
the watch asked for: someone else's consumer can be made to deliver into our inbox. Then it goes
through `kventry.change_of`: JetStream's own answers redirected into the bucket are dropped and
logged (`kv_entry_dropped`, `security=true`), as nats-server can refuse neither; with
`--bus-signatures` on, so is an entry its key's owner did not sign. A watch of the owner's own
keys asks for refused entries too (`rejected=True`): it gets a change with `rejected` set, and
puts its value back; in accept mode also for an unsigned entry on its key (written before it
signed), to sign it.
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
from nats.js.kv import KeyValue

from shared.backoff import Backoff
from shared.bus import kvfollow
from shared.bus.connection import Bus
from shared.bus.kventry import SYNCED, KVChange, change_of, dropped
from shared.bus.signing import CERTIFIED_ROLES
from shared.cancellation import reraise_if_cancelling
from shared.errors import BusUnavailableError, ProgrammingError

__all__ = ["KVChange", "checked", "watch"]

_WATCH_FAILED = (BusUnavailableError, nats.errors.Error, TimeoutError)
_INACTIVE_THRESHOLD_S = 60.0
# Missed heartbeats before a watch counts its consumer as lost (nats.go's ordered consumer
# waits as many): one late heartbeat is not a lost consumer.
_STALL_HEARTBEATS = 3

log = structlog.get_logger(__name__)


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


async def _start(bus: Bus, *, bucket: str, keys: str) -> _Watcher:
    """A fresh consumer: with a node, the one named for it (the one a previous start left is
    deleted, so the new one replays from scratch); otherwise a random name."""
    await bus.kv(bucket)
    if not bus.node:
        return await _create(bus, bucket=bucket, keys=keys, name=f"w{secrets.token_hex(8)}")
    name = bus.names.consumer(bus.component, bus.node, "watch")
    with contextlib.suppress(nats.js.errors.NotFoundError):
        await bus.js.delete_consumer(bus.names.kv_stream(bucket), name)
    return await _create(bus, bucket=bucket, keys=keys, name=name)


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
    # The consumer's own delivery has reply `$JS.ACK...`: judge the entry by headers and data.
    stored_at = msg.metadata.timestamp.timestamp() if msg.metadata.timestamp else None
    return change_of(
        bus, subject=msg.subject, key=msg.subject[len(source.prefix) :], data=msg.data or b"",
        headers=msg.headers or {}, revision=msg.metadata.sequence.stream, stored_at=stored_at,
        replayed=replayed, rejected=rejected,
    )  # fmt: skip


async def watch(
    bus: Bus, *, bucket: str, keys: str, rejected: bool = False
) -> AsyncIterator[KVChange]:
    """Yield changes of `keys` in `bucket` forever, starting again after reconnects (and, on a
    consumer, when it is lost: no entry nor heartbeat for `_STALL_HEARTBEATS` heartbeats).
    `rejected`: also yield entries refused by `Records.check` (flagged `rejected`), for the
    owner of the keys, which puts its value back."""
    if bus.component in CERTIFIED_ROLES:
        changes = kvfollow.follow(bus, bucket=bucket, keys=keys, rejected=rejected)
    else:
        changes = _watch(bus, bucket=bucket, keys=keys, rejected=rejected)
    async for change in changes:
        yield change


async def _watch(bus: Bus, *, bucket: str, keys: str, rejected: bool) -> AsyncIterator[KVChange]:
    backoff = Backoff(initial_s=0.1, max_s=5.0)
    names = bus.names
    prefix = names.kv_subject(bucket, "")
    stall_s = _STALL_HEARTBEATS * bus.settings.watch_heartbeat_s
    loop = asyncio.get_running_loop()
    while True:
        await bus.connected.wait()
        epoch = bus.epoch
        try:
            watcher = await _start(bus, bucket=bucket, keys=keys)
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
                yield SYNCED
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
                    dropped(msg.subject, reason="not_this_watch")
                    continue  # nor its pending count: another consumer's delivery
                change = _change(bus, msg, source=source, replayed=not synced, rejected=rejected)
                if change is not None:
                    yield change
                if not synced and msg.metadata.num_pending == 0:
                    synced = True
                    yield SYNCED
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


async def _pause_after(exc: Exception, *, bucket: str, backoff: Backoff) -> None:
    """A watch failed to start: log it and back off before the next try."""
    reraise_if_cancelling()
    log.warning("kv_watch_failed", bucket=bucket, error=str(exc) or type(exc).__name__)
    await backoff.sleep()
