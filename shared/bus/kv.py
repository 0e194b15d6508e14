"""Watching a KV bucket across NATS outages: current values first, then every change.

`watch()` yields `KVChange`s forever. After a reconnect it restarts the watch, which replays the
latest value of every key, so a consumer that applies changes idempotently converges.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

import nats.errors
import structlog
from nats.js.kv import KV_DEL, KV_PURGE

from shared.backoff import Backoff
from shared.bus.connection import Bus
from shared.cancellation import reraise_if_cancelling
from shared.errors import BusUnavailableError

__all__ = ["KVChange", "watch"]

_WATCH_FAILED = (BusUnavailableError, nats.errors.Error, TimeoutError)

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class KVChange:
    key: str
    # None when the key was deleted or purged.
    value: bytes | None
    revision: int
    # True on the marker that ends the replay of current values after each (re)start.
    synced: bool = False


async def watch(bus: Bus, *, bucket: str, keys: str) -> AsyncIterator[KVChange]:
    """Yield changes of `keys` in `bucket` forever, resubscribing after reconnects."""
    backoff = Backoff(initial_s=0.1, max_s=5.0)
    while True:
        await bus.connected.wait()
        epoch = bus.epoch
        try:
            kv = await bus.kv(bucket)
            watcher = await kv.watch(keys)
            reraise_if_cancelling()
        except _WATCH_FAILED as exc:
            await _pause_after(exc, bucket=bucket, backoff=backoff)
            continue
        backoff.reset()
        reconnected = asyncio.ensure_future(bus.wait_epoch_after(epoch))
        synced = False
        replayed = False
        try:
            while True:
                update = asyncio.ensure_future(watcher.updates(timeout=None))  # type: ignore[no-untyped-call]  # untyped upstream
                done, _ = await asyncio.wait(
                    {update, reconnected}, return_when=asyncio.FIRST_COMPLETED
                )
                if update not in done:
                    update.cancel()
                    break
                entry = update.result()
                if entry is None:
                    if not synced and (replayed or not await _holds(bus, bucket, keys)):
                        synced = True
                        yield _SYNCED
                    reraise_if_cancelling()  # _holds' request may have swallowed a stop
                    continue
                if not hasattr(entry, "key"):
                    break  # the stop sentinel: the watcher was stopped under us
                deleted = entry.operation in (KV_DEL, KV_PURGE)
                yield KVChange(
                    key=entry.key,
                    value=None if deleted else entry.value,
                    revision=entry.revision or 0,
                )
                replayed = True
                if not synced and entry.delta == 0:
                    synced = True
                    yield _SYNCED
        except _WATCH_FAILED as exc:
            await _pause_after(exc, bucket=bucket, backoff=backoff)
        finally:
            reconnected.cancel()
            with contextlib.suppress(nats.errors.Error, TimeoutError, AttributeError):
                await watcher.stop()  # type: ignore[no-untyped-call]  # untyped upstream


_SYNCED = KVChange(key="", value=None, revision=0, synced=True)


async def _pause_after(exc: Exception, *, bucket: str, backoff: Backoff) -> None:
    """A watch failed to start or to list: log it and back off before the next try."""
    reraise_if_cancelling()
    log.warning("kv_watch_failed", bucket=bucket, error=str(exc) or type(exc).__name__)
    await backoff.sleep()


async def _holds(bus: Bus, bucket: str, keys: str) -> bool:
    """Whether `bucket` has a message (value or delete marker) for `keys`.

    nats-py ends the replay with a None marker once the consumer has nothing pending. It also
    sends one at creation when the server has already sent the whole replay but none of it
    has reached the client yet: the marker then comes first and the replay after it. Before any
    entry, the marker is trusted only when there is nothing to replay; otherwise the replay
    ends at the entry after which nothing is pending. Stream and subject names are the KV
    protocol's (`KV_<bucket>`, `$KV.<bucket>.<key>`).
    """
    info = await bus.js.stream_info(f"KV_{bucket}", subjects_filter=f"$KV.{bucket}.{keys}")
    return bool(info.state.subjects)
