"""A node agent's watch of its own keys without a JetStream consumer: the current values by
direct get, then every change as the bucket's stream republishes it.

Each KV stream republishes what it stores, once the write has its quorum, to
`dra.kv.<bucket>.<key>` (`streams.kv_stream`, `Names.kv_followed`), adding `Nats-Stream`,
`Nats-Subject`, `Nats-Sequence` (the entry's revision), `Nats-Time-Stamp` and
`Nats-Last-Sequence`. A (re)start subscribes there for the watch's keys, then reads each key's
current value with a direct get (the keys of a pattern are listed first, by stream info with a
subjects filter), yields them and the synced marker, and goes on with the republished copies.
One counts only when its sequence is past the one the watch holds for that key, so what the
reads already saw, or an older copy arriving late, changes nothing.

Why not a consumer, as other buses use (`kv`): every consumer is an entry of JetStream's meta
layer on every server of a cluster and sends an idle heartbeat, and a fleet of 5,000 nodes of
three agents held 45,000 of them; the servers' snapshots of that layer took minutes of CPU. A
node agent now holds none, and its permissions allow none.

A republish is sent once and not again (as the consumers' deliveries were, acks off). The watch
reads every key again after a reconnect of this client, and when the stream elects a new leader
(JetStream's advisory, which it also follows): a leader that stored a change and failed before
republishing it is how a change goes missing while this connection stays up. Those reads wait
a random part of `_REREAD_SPREAD_S`, so a fleet does not ask at once.

A message on a followed subject counts only when its headers name this bucket's stream, the key
it arrived on and a sequence: nobody may publish there (`services.natsauth.permissions`), and
what JetStream itself answers there on someone's request names another stream or key, or none.
The stored message, as it was stored (`stored_headers`), then goes through `change_of`: one that
was itself JetStream's answer, redirected into the bucket, is dropped there (and reaches the
key's owner as refused, to be put back).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass

import nats.errors
import nats.js.errors
import structlog
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from shared.backoff import Backoff
from shared.bus.connection import Bus
from shared.bus.kventry import SYNCED, KVChange, change_of, dropped, stored_headers
from shared.cancellation import reraise_if_cancelling
from shared.errors import BusUnavailableError

__all__ = ["follow"]

_FAILED = (BusUnavailableError, nats.errors.Error, nats.js.errors.Error, TimeoutError)
_REREAD_SPREAD_S = 5.0

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class _Stored:
    """A stored entry as JetStream sent it: on `subject` of the stream, at `sequence`."""

    subject: str
    sequence: int
    data: bytes
    headers: Mapping[str, str]
    stored_at: float | None


async def follow(bus: Bus, *, bucket: str, keys: str, rejected: bool) -> AsyncIterator[KVChange]:
    """Yield the current values of `keys` in `bucket`, the synced marker, then each change,
    forever; after a reconnect or a new stream leader, the current values again."""
    backoff = Backoff(initial_s=0.1, max_s=5.0)
    stream = bus.names.kv_stream(bucket)
    prefix = bus.names.kv_subject(bucket, "")
    elected = bus.names.js_leader_elected(stream)
    followed = bus.names.kv_followed(bucket, "")
    delay_s = 0.0
    while True:
        await bus.connected.wait()
        if delay_s:
            await asyncio.sleep(delay_s)
        epoch = bus.epoch
        arrived: asyncio.Queue[Msg] = asyncio.Queue()
        subscriptions: list[Subscription] = []
        try:
            await bus.kv(bucket)
            for subject in (bus.names.kv_followed(bucket, keys), elected):
                subscriptions.append(await bus.nc.subscribe(subject, cb=_into(arrived)))
            current = await _read(bus, bucket=bucket, keys=keys)
            reraise_if_cancelling()
        except _FAILED as exc:
            await _unsubscribe(subscriptions)
            reraise_if_cancelling()
            log.warning("kv_watch_failed", bucket=bucket, error=str(exc) or type(exc).__name__)
            await backoff.sleep()
            continue
        backoff.reset()
        held: dict[str, int] = {}
        reconnected = asyncio.ensure_future(bus.wait_epoch_after(epoch))
        update: asyncio.Future[Msg] | None = None
        try:
            for entry in current:
                key = entry.subject[len(prefix) :]
                held[key] = entry.sequence
                change = _change_of(bus, entry, key=key, replayed=True, rejected=rejected)
                if change is not None:
                    yield change
            yield SYNCED
            while True:
                if arrived.empty():
                    update = asyncio.ensure_future(arrived.get())
                    await asyncio.wait({update, reconnected}, return_when=asyncio.FIRST_COMPLETED)
                if reconnected.done():
                    delay_s = 0.0
                    break
                msg = update.result() if update is not None else arrived.get_nowait()
                update = None
                if msg.subject == elected:
                    log.info("kv_watch_rereading", bucket=bucket, reason="stream_leader_elected")
                    delay_s = random.uniform(0, _REREAD_SPREAD_S)
                    break
                copy = _republished(msg, stream=stream, prefix=prefix, followed=followed)
                if copy is None:
                    continue
                key = copy.subject[len(prefix) :]
                if copy.sequence <= held.get(key, 0):
                    continue  # read already, or an older copy come late
                held[key] = copy.sequence
                change = _change_of(bus, copy, key=key, replayed=False, rejected=rejected)
                if change is not None:
                    yield change
        finally:
            reconnected.cancel()
            if update is not None:
                update.cancel()  # also when the caller closes the generator mid-wait
            await _unsubscribe(subscriptions)


async def _read(bus: Bus, *, bucket: str, keys: str) -> list[_Stored]:
    """The current entry of each of `keys` (a pattern's keys listed by stream info), deletes
    and purges included, in the order of their sequences."""
    stream, pattern = bus.names.kv_stream(bucket), bus.names.kv_subject(bucket, keys)
    subjects = [pattern]
    if "*" in keys or ">" in keys:
        info = await bus.js.stream_info(stream, subjects_filter=pattern)
        subjects = sorted(info.state.subjects or {})
    found: list[_Stored] = []
    for subject in subjects:
        try:
            raw = await bus.js.get_msg(stream, subject=subject, direct=True)
        except nats.js.errors.NotFoundError:
            continue  # never written, or its delete marker has expired
        headers = raw.headers or {}
        if raw.subject != subject or headers.get("Nats-Stream") != stream or not raw.seq:
            dropped(subject, reason="not_this_watch")
            continue
        stored_at = raw.time.timestamp() if raw.time is not None else None
        found.append(_Stored(subject, raw.seq, raw.data or b"", headers, stored_at))
    return sorted(found, key=lambda entry: entry.sequence)


def _republished(msg: Msg, *, stream: str, prefix: str, followed: str) -> _Stored | None:
    """The stored entry `msg` (sent to `followed` + key) republishes; None (logged) for
    anything else sent there."""
    headers = msg.headers or {}
    subject = prefix + msg.subject.removeprefix(followed)
    sequence = headers.get("Nats-Sequence", "")
    if (
        headers.get("Nats-Stream") != stream
        or headers.get("Nats-Subject") != subject
        or "Nats-Last-Sequence" not in headers
        or not sequence.isdigit()
    ):
        dropped(msg.subject, reason="not_this_watch")
        return None
    # Republished as it is stored: the check's clock stands for the time it was stored.
    return _Stored(subject, int(sequence), msg.data or b"", headers, None)


def _change_of(
    bus: Bus, entry: _Stored, *, key: str, replayed: bool, rejected: bool
) -> KVChange | None:
    return change_of(
        bus, subject=entry.subject, key=key, data=entry.data, headers=stored_headers(entry.headers),
        revision=entry.sequence, stored_at=entry.stored_at, replayed=replayed, rejected=rejected,
    )  # fmt: skip


def _into(queue: asyncio.Queue[Msg]) -> Callable[[Msg], Awaitable[None]]:
    async def enqueue(msg: Msg) -> None:
        queue.put_nowait(msg)

    return enqueue


async def _unsubscribe(subscriptions: list[Subscription]) -> None:
    for subscription in subscriptions:
        with contextlib.suppress(nats.errors.Error, TimeoutError):
            await subscription.unsubscribe()
