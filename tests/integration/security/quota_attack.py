"""A node writing as many keys under its own name as it can: the attack the quota auditor
stops. Shared by `test_bus_quota.py` and `bench.bus_quota`."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import nats
import nats.errors

from services.natsauth import quota
from shared.bus.connection import Bus
from shared.bus.subjects import Names
from tests.integration.security.callout_stack import DRIVER, ROLES, CalloutStack

__all__ = ["FLOODS", "Flood", "FloodKind", "Steady", "flood", "steady_puts"]


_POLL_S = 0.005


@dataclass(frozen=True, slots=True)
class FloodKind:
    account: str
    bucket: Callable[[Names], str]


FLOODS = {
    "health": FloodKind("dra-health", lambda names: names.health_bucket),
    "claims": FloodKind("dra-allocation", lambda names: names.claims_bucket),
}


@dataclass(slots=True)
class Flood:
    sent: int = 0
    over_at: float | None = None
    """When the first key over the quota was published (the event loop's clock)."""
    closed_at: float | None = None
    """When the attacker's connection was found closed."""

    @property
    def enforce_s(self) -> float | None:
        """From the first key over the quota to the connection ended."""
        if self.over_at is None or self.closed_at is None:
            return None
        return self.closed_at - self.over_at


async def flood(
    stack: CalloutStack, kind: FloodKind, node: str, *, value_size: int, timeout_s: float = 20.0
) -> Flood:
    """Node `node`'s identity `kind.account` puts new keys of `value_size` bytes under its own
    name without waiting for acks, until the server ends its connection (or `timeout_s`)."""
    names = Names(stack.bus_namespace)
    bucket = kind.bucket(names)
    limit = quota.quota_of(bucket)
    assert limit is not None
    token = await stack.token(kind.account, node=node)
    inbox = names.inbox_prefix(ROLES[kind.account], node)
    result = Flood()
    loop = asyncio.get_running_loop()
    value = os.urandom(value_size)

    async def on_error(exc: Exception) -> None:
        pass  # the server's kick, expected

    nc = await nats.connect(
        stack.server.url, token=token, inbox_prefix=inbox, allow_reconnect=False,
        connect_timeout=2, error_cb=on_error,
    )  # fmt: skip
    try:
        deadline = loop.time() + timeout_s
        # A health key and a claim key of a node have the same layout: <driver>.<node>.<name>.
        prefix = names.kv_subject(bucket, Names.health_key(DRIVER, node, "junk"))
        while loop.time() < deadline and not nc.is_closed:
            if result.sent == limit.keys:
                result.over_at = loop.time()
            try:
                # Bounded: a publish waiting for room in a full buffer when the server ends
                # the connection would wait for good.
                await asyncio.wait_for(nc.publish(f"{prefix}{result.sent}", value), 1.0)
            except (nats.errors.Error, TimeoutError):
                break
            result.sent += 1
            if result.sent % 32 == 0:
                await asyncio.sleep(0)  # no flush: its PONG wait would outlive a kick
        # nats-py reports a connection the server ended with no callback when it does not
        # reconnect: watch its state.
        for _ in range(int(max(0.0, deadline - loop.time()) / _POLL_S)):
            if nc.is_closed:
                break
            await asyncio.sleep(_POLL_S)
        if nc.is_closed:
            result.closed_at = loop.time()
    finally:
        await nc.close()
    return result


@dataclass(slots=True)
class Steady:
    """Puts of a well-behaved node, one every `interval_s`, and those that failed."""

    done: int = 0
    failed: list[str] = field(default_factory=list)


@contextlib.asynccontextmanager
async def steady_puts(bus: Bus, bucket: str, *, interval_s: float = 0.02) -> AsyncIterator[Steady]:
    """Put a new key of the bus's node every `interval_s` and delete the one before (a device
    appearing and going): a new key is what a full bucket refuses."""
    steady = Steady()
    assert bus.node

    # A stop flag, not only a cancel: the client library may turn a cancel that lands inside
    # a put into an error of its own, which the loop below records and goes on from.
    stopping = asyncio.Event()

    async def put_forever() -> None:
        previous = ""
        while not stopping.is_set():
            key = Names.health_key(DRIVER, bus.node, f"dev{steady.done + len(steady.failed)}")
            try:
                await bus.kv_put(bucket, key, b"a device's record")
                steady.done += 1
                if previous:
                    await bus.kv_delete(bucket, previous)
                previous = key
            except Exception as exc:  # every failure is what the test is about
                if not stopping.is_set():
                    steady.failed.append(repr(exc))
            await asyncio.sleep(interval_s)

    task = asyncio.create_task(put_forever())
    try:
        yield steady
    finally:
        stopping.set()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
