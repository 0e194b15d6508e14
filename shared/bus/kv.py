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
`$JS.API.CONSUMER.CREATE.<stream>.<name>.<filter>`, the one consumer-create form whose filter
is in the subject, so nats-server can allow a node agent to watch its own keys and nothing
else (`services.natsauth.permissions`). It delivers to this Bus's own inbox; the server
removes it once nobody listens. An entry that is JetStream's own answer (`origin`) was not put
by a client but redirected into the bucket as the reply of someone's request; it is dropped
and logged, as nats-server cannot refuse reply subjects.
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
from nats.js.kv import KV_DEL, KV_OP, KV_PURGE

from shared.backoff import Backoff
from shared.bus import origin
from shared.bus.connection import Bus
from shared.cancellation import reraise_if_cancelling
from shared.errors import BusUnavailableError

__all__ = ["KVChange", "watch"]

_WATCH_FAILED = (BusUnavailableError, nats.errors.Error, TimeoutError)
_MARKER_REASON = "Nats-Marker-Reason"
_INACTIVE_THRESHOLD_S = 60.0
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


_SYNCED = KVChange(key="", value=None, revision=0, synced=True)


@dataclass(slots=True)
class _Watcher:
    subscription: Subscription
    queue: asyncio.Queue[Msg]
    replay: int
    """How many entries the consumer had to replay when it was created (0: synced at once)."""


async def _start(bus: Bus, *, bucket: str, keys: str) -> _Watcher:
    nc, js, names = bus.nc, bus.js, bus.names
    await bus.kv(bucket)  # created on first use, as before
    queue: asyncio.Queue[Msg] = asyncio.Queue()

    async def enqueue(msg: Msg) -> None:
        queue.put_nowait(msg)

    deliver = nc.new_inbox()
    # Subscribed before the consumer exists, so no delivery can come before the listener.
    subscription = await nc.subscribe(deliver, cb=enqueue)
    config = api.ConsumerConfig(
        name=f"w{secrets.token_hex(8)}",
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
        info = await js.add_consumer(names.kv_stream(bucket), config=config)
    except BaseException:
        with contextlib.suppress(nats.errors.Error, TimeoutError):
            await subscription.unsubscribe()
        raise
    delivered = info.delivered.consumer_seq if info.delivered is not None else 0
    return _Watcher(subscription, queue, replay=(info.num_pending or 0) + (delivered or 0))


def _change(msg: Msg, *, prefix: str) -> KVChange | None:
    headers = msg.headers or {}
    # The consumer's own delivery has reply `$JS.ACK...`: judge the entry by headers and data.
    if origin.is_jetstream_reply(reply="", headers=headers, data=msg.data):
        log.warning(
            "kv_entry_dropped", subject=msg.subject, reason="jetstream_reply", security=True
        )
        return None
    operation = headers.get(KV_OP) or (
        KV_PURGE if headers.get(_MARKER_REASON) in ("MaxAge", "Purge", "Remove") else None
    )
    deleted = operation in (KV_DEL, KV_PURGE)
    return KVChange(
        key=msg.subject[len(prefix) :],
        value=None if deleted else msg.data,
        revision=msg.metadata.sequence.stream,
    )


async def watch(bus: Bus, *, bucket: str, keys: str) -> AsyncIterator[KVChange]:
    """Yield changes of `keys` in `bucket` forever, resubscribing after reconnects and when
    the consumer is lost (no entry nor heartbeat for `_STALL_HEARTBEATS` heartbeats)."""
    backoff = Backoff(initial_s=0.1, max_s=5.0)
    prefix = bus.names.kv_subject(bucket, "")
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
                change = _change(msg, prefix=prefix)
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


async def _pause_after(exc: Exception, *, bucket: str, backoff: Backoff) -> None:
    """A watch failed to start: log it and back off before the next try."""
    reraise_if_cancelling()
    log.warning("kv_watch_failed", bucket=bucket, error=str(exc) or type(exc).__name__)
    await backoff.sleep()
