"""The guard of an owner's own KV keys: what is not the owner's own write is put back at once.

An identity with another node's credentials can still have nats-server store something on our
keys (a JetStream answer redirected onto the key, an emptied entry); readers drop it, but the
key holds no valid record of ours until we write it again. `OwnKeysGuard` watches the owner's
keys (`kv.watch(rejected=True)`, so refused entries come too) and hands each changed key to the
owner's `restore`, which re-reads the key, compares it with what it wants there and, when they
differ, puts its value back and says why (`Restored`); the guard counts that in the owner's
counter, by reason.

An attacker who keeps rewriting a key must not make the owner spin: changes of one key that
arrive while the guard is busy are handled once, and re-puts are paced (`ReassertPace`): a
burst goes out at once, then each further re-put waits an exponentially growing delay, until
the key has been left alone for a while. A wait is logged (`bus_reasserts_throttled`,
`security=true`) and counted in `dra_bus_reasserts_throttled_total{records}`.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import structlog
from opentelemetry.metrics import Counter

from shared import metrics
from shared.backoff import Backoff
from shared.bus import kv
from shared.bus.connection import Bus
from shared.cancellation import reraise_if_cancelling
from shared.errors import BusUnavailableError

__all__ = ["OwnKeysGuard", "ReassertPace", "Restore", "Restored"]

log = structlog.get_logger(__name__)
_meter = metrics.meter(__name__)
THROTTLED = _meter.create_counter(
    "dra_bus_reasserts_throttled",
    unit="1",
    description="Times an owner had to wait before putting back another of its records (its "
    "keys were rewritten faster than its re-assert pace), by kind of records.",
)

REASONS = ("differs", "deleted", "rejected")
"""Why a record was put back: another value, none (deleted, purged), or one the record check
refused (unsigned, a redirected JetStream answer, another writer's signature)."""


@dataclass(frozen=True, slots=True)
class Restored:
    """What `restore` did about one key: `reason` (from `REASONS`) when it put its value back,
    "" when the key already held what the owner wants there, or nothing is its to restore."""

    reason: str = ""


NOTHING = Restored()

Restore = Callable[[kv.KVChange], Awaitable[Restored]]
"""The owner's side: make the changed key hold what it wants there (a fresh read decides)."""


@dataclass(slots=True, kw_only=True)
class ReassertPace:
    """How fast an owner may put its records back: `burst` re-puts at once, then a delay
    growing from `backoff.initial_s` up to `backoff.max_s` before each further one, until no
    re-put was needed for `quiet_s` after the last delay ended."""

    burst: int = 16
    quiet_s: float = 60.0
    backoff: Backoff = field(default_factory=lambda: Backoff(initial_s=0.5, max_s=15.0))
    clock: Callable[[], float] = time.monotonic
    _streak: int = 0
    _free_at: float = -math.inf

    def after_reassert(self) -> float:
        """Record one re-put; the seconds to wait before the next one."""
        now = self.clock()
        if now - self._free_at >= self.quiet_s:
            self._streak = 0
            self.backoff.reset()
        self._streak += 1
        delay = 0.0 if self._streak < self.burst else self.backoff.next_delay()
        self._free_at = max(self._free_at, now + delay)
        return delay

    def most_in(self, seconds: float) -> int:
        """The most re-puts this pace allows within `seconds` from a quiet start (each delay is
        at least half its nominal value: the backoff's jitter)."""
        allowed, spent, attempt = self.burst, 0.0, 0
        while True:
            nominal = min(self.backoff.max_s, self.backoff.initial_s * self.backoff.factor**attempt)
            spent += nominal / 2
            if spent > seconds:
                return allowed
            allowed += 1
            attempt += 1


class OwnKeysGuard:
    """Watches `keys` of `bucket` (the owner's own) and has `restore` put back what another
    writer left there; one watch (`kv.watch`)."""

    def __init__(
        self,
        bus: Bus,
        *,
        bucket: str,
        keys: str,
        restore: Restore,
        counter: Counter,
        records: str,
        pace: ReassertPace | None = None,
    ) -> None:
        self._bus = bus
        self._bucket = bucket
        self._keys = keys
        self._restore = restore
        self._counter = counter
        self._records = records
        self.pace = pace or ReassertPace()
        # Changed keys not handled yet: the latest change of each, a refused one kept first
        # (it says more than a later echo of our own put).
        self._pending: dict[str, kv.KVChange] = {}
        self._arrived = asyncio.Event()

    async def run(self) -> None:
        """Eternal: follow the keys and put back what is not the owner's."""
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._follow(), name=f"{self._records}-guard-watch")
            tasks.create_task(self._put_back(), name=f"{self._records}-guard-restore")

    async def _follow(self) -> None:
        async for change in kv.watch(
            self._bus, bucket=self._bucket, keys=self._keys, rejected=True
        ):
            if change.synced:
                continue
            held = self._pending.get(change.key)
            if held is None or not held.rejected:
                self._pending[change.key] = change
            self._arrived.set()

    async def _put_back(self) -> None:
        while True:
            await self._arrived.wait()
            self._arrived.clear()
            while self._pending:
                key = next(iter(self._pending))
                change = self._pending.pop(key)
                try:
                    restored = await self._restore(change)
                    reraise_if_cancelling()
                except BusUnavailableError as exc:
                    # Not lost: the owner resyncs its keys after the reconnect.
                    log.warning("bus_reassert_failed", key=key, error=str(exc))
                    continue
                if restored.reason:
                    self._counter.add(1, {"reason": restored.reason})
                    await self._paced(key)

    async def _paced(self, key: str) -> None:
        delay_s = self.pace.after_reassert()
        if delay_s <= 0:
            return
        THROTTLED.add(1, {"records": self._records})
        log.warning(
            "bus_reasserts_throttled",
            security=True,
            records=self._records,
            key=key,
            wait_s=round(delay_s, 2),
        )
        await asyncio.sleep(delay_s)
