"""Read-only JetStream access for an operator (dractl): bind to buckets and streams, never
create them, and read what they hold.

A bucket or stream that does not exist is None (or nothing), not an error: on a bus where no
agent has published yet there is nothing to read. Every other NATS error becomes
BusUnavailableError here, so that `nats` exceptions never reach the caller.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass

import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import api
from nats.js.kv import KeyValue

from shared.bus import records
from shared.bus.connection import Bus
from shared.bus.kv import checked
from shared.errors import BusUnavailableError

__all__ = [
    "ReadOnlyBucket",
    "StreamMessage",
    "StreamReader",
    "StreamState",
    "bind_bucket",
    "latest_values",
    "read_stream",
    "stream_state",
]

_LATEST_READ_TIMEOUT_S = 30.0
# From how many records `latest_values` checks signatures on threads, and on at most how many.
_THREADED_CHECKS = 512
_CHECK_THREADS = 4
# How `latest_values` tells a deleted key (the KV protocol's operation header).
_KV_OPERATION = "KV-Operation"
_KV_REMOVALS = ("DEL", "PURGE")


class ReadOnlyBucket:
    """A KV bucket bound for reading; with signatures on, its values are checked records."""

    def __init__(self, name: str, store: KeyValue) -> None:
        self.name = name
        self._store = store

    async def keys(self) -> list[str]:
        """Every key, sorted; none in an empty bucket."""
        try:
            return sorted(await self._store.keys())
        except nats.js.errors.NoKeysError:
            return []
        except (nats.errors.Error, TimeoutError) as exc:
            raise BusUnavailableError(f"kv bucket {self.name}: {exc}", subject=self.name) from exc

    async def value(self, key: str) -> bytes | None:
        """The key's value; None for a key that is missing or deleted (or refused)."""
        try:
            entry = await self._store.get(key)
        except nats.js.errors.KeyNotFoundError:
            return None
        except (nats.errors.Error, TimeoutError) as exc:
            raise BusUnavailableError(f"kv get {self.name}/{key}: {exc}", subject=key) from exc
        return entry.value


async def bind_bucket(bus: Bus, bucket: str) -> ReadOnlyBucket | None:
    """The bucket if it exists; never creates it (a reader leaves no trace)."""
    try:
        store = await bus.js.key_value(bucket)
    except nats.js.errors.BucketNotFoundError:
        return None
    except (nats.errors.Error, TimeoutError) as exc:
        raise BusUnavailableError(f"kv bucket {bucket}: {exc}", subject=bucket) from exc
    return ReadOnlyBucket(bucket, checked(bus, bucket, store))


async def latest_values(
    bus: Bus,
    bucket: str,
    keys: str,
    *,
    refused: Callable[[str, str], None] | None = None,
) -> list[tuple[str, bytes]]:
    """(key, value) of every live key matching `keys` (a subject filter: `driver.>`), sorted,
    from one ordered consumer: a request per key would take minutes on thousands of keys.
    None at all when the bucket does not exist. With signatures on, a value its key's owner
    did not sign is left out and given to `refused` (key, reason)."""
    prefix = bus.names.kv_subject(bucket, "")
    latest: dict[str, Msg] = {}
    done = asyncio.Event()

    async def collect(msg: Msg) -> None:
        key = msg.subject[len(prefix) :]
        if (msg.headers or {}).get(_KV_OPERATION) in _KV_REMOVALS:
            latest.pop(key, None)
        else:
            latest[key] = msg
        if msg.metadata.num_pending == 0:
            done.set()

    try:
        info = await bus.js.stream_info(bus.names.kv_stream(bucket))
        if info.state.messages == 0:
            return []
        subscription = await bus.js.subscribe(
            bus.names.kv_subject(bucket, keys),
            stream=bus.names.kv_stream(bucket),
            cb=collect,
            ordered_consumer=True,
            deliver_policy=api.DeliverPolicy.LAST_PER_SUBJECT,
        )
        try:
            # No key matches: the consumer has nothing to deliver, and says so.
            consumer = await subscription.consumer_info()
            delivered = consumer.delivered.consumer_seq if consumer.delivered else 0
            if consumer.num_pending == 0 and not delivered:
                return []
            await asyncio.wait_for(done.wait(), _LATEST_READ_TIMEOUT_S)
        finally:
            await subscription.unsubscribe()
    except nats.js.errors.NotFoundError:
        return []
    except (nats.errors.Error, TimeoutError) as exc:
        raise BusUnavailableError(f"kv bucket {bucket}: {exc}", subject=bucket) from exc
    found: list[tuple[str, bytes]] = []
    checks = await _checks(bus, list(latest.values()))
    for (key, msg), check in zip(latest.items(), checks, strict=True):
        if check.ok:
            found.append((key, msg.data))
        elif refused is not None:
            refused(key, check.reason)
    return sorted(found)


async def _checks(bus: Bus, messages: list[Msg]) -> list[records.Check]:
    """`Bus.check_message` of each message, in order. Many are checked on a few threads at
    once: most of a check is the ed25519 verification, which runs without the GIL, and a
    fleet's records are tens of thousands."""
    if not bus.records.on or len(messages) < _THREADED_CHECKS:
        return [bus.check_message(msg, event="kv_entry_dropped") for msg in messages]
    threads = min(_CHECK_THREADS, os.cpu_count() or 1)
    size = -(-len(messages) // threads)
    chunks = [messages[start : start + size] for start in range(0, len(messages), size)]

    def check(chunk: list[Msg]) -> list[records.Check]:
        return [bus.check_message(msg, event="kv_entry_dropped") for msg in chunk]

    loop = asyncio.get_running_loop()
    with concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="check") as pool:
        done = await asyncio.gather(*(loop.run_in_executor(pool, check, c) for c in chunks))
    return [found for chunk in done for found in chunk]


@dataclass(frozen=True, slots=True)
class StreamState:
    """Which sequences a stream holds."""

    first_seq: int
    last_seq: int
    messages: int


async def stream_state(bus: Bus, stream: str) -> StreamState | None:
    """The stream's sequences; None when it does not exist."""
    try:
        info = await bus.js.stream_info(stream)
    except nats.js.errors.NotFoundError:
        return None
    except (nats.errors.Error, TimeoutError) as exc:
        raise BusUnavailableError(f"stream {stream}: {exc}", subject=stream) from exc
    return StreamState(
        first_seq=info.state.first_seq,
        last_seq=info.state.last_seq,
        messages=info.state.messages,
    )


class StreamMessage:
    """One message a stream delivered."""

    def __init__(self, bus: Bus, msg: Msg) -> None:
        self._bus = bus
        self._msg = msg

    @property
    def subject(self) -> str:
        return self._msg.subject

    @property
    def data(self) -> bytes:
        return self._msg.data

    @property
    def headers(self) -> Mapping[str, str] | None:
        return self._msg.headers

    def check(self) -> records.Check:
        """`Bus.check_message`: whether its signer may have written it (signatures on)."""
        return self._bus.check_message(self._msg)


class StreamReader:
    """The messages of a stream from a start sequence on, in order (`read_stream`)."""

    def __init__(self, bus: Bus, subscription: Subscription) -> None:
        self._bus = bus
        self._subscription = subscription

    async def next(self, *, timeout_s: float) -> StreamMessage | None:
        """The next message; None when none arrives within `timeout_s`."""
        try:
            msg = await self._subscription.next_msg(timeout=timeout_s)
        except nats.errors.TimeoutError:
            return None
        except (nats.errors.Error, TimeoutError) as exc:
            subject = self._subscription.subject
            raise BusUnavailableError(f"read {subject}: {exc}", subject=subject) from exc
        return StreamMessage(self._bus, msg)


@contextlib.asynccontextmanager
async def read_stream(
    bus: Bus, *, stream: str, subjects: str, start_seq: int
) -> AsyncIterator[StreamReader]:
    """An ordered consumer of `stream` (its messages on `subjects`) from `start_seq` on, that
    ends when the context does."""
    try:
        subscription = await bus.js.subscribe(
            subjects,
            stream=stream,
            ordered_consumer=True,
            config=api.ConsumerConfig(
                deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start_seq
            ),
        )
    except (nats.errors.Error, TimeoutError) as exc:
        raise BusUnavailableError(f"stream {stream}: {exc}", subject=stream) from exc
    try:
        yield StreamReader(bus, subscription)
    finally:
        try:
            await subscription.unsubscribe()
        except (nats.errors.Error, TimeoutError) as exc:
            raise BusUnavailableError(f"stream {stream}: {exc}", subject=stream) from exc
