"""The health agent's liveness refresh on a real nats-server: unchanged records are rewritten
about every `refresh_s`, each at its own jittered time, so a fleet started together spreads its
rewrites over the period instead of sending them in one wave."""

from __future__ import annotations

from itertools import pairwise
from statistics import mean

from services.health.recorder import HealthRecorder
from shared.bus.connection import Bus
from shared.pb.drasuite.v1 import health_pb2

REFRESH_S = 100.0
DEVICES = 200


class _Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def _records() -> dict[str, health_pb2.DeviceHealth]:
    return {
        f"npu-{i}": health_pb2.DeviceHealth(
            driver="sim.dra-suite.io",
            node="node-a",
            device=f"npu-{i}",
            state=health_pb2.HEALTH_STATE_HEALTHY,
        )
        for i in range(DEVICES)
    }


def _recorder(bus: Bus, clock: _Clock) -> HealthRecorder:
    return HealthRecorder(
        bus, driver="sim.dra-suite.io", node="node-a", refresh_s=REFRESH_S, clock=clock
    )


async def _written_at(recorder: HealthRecorder) -> dict[str, float]:
    return {name: r.updated_unix_ms / 1000 for name, r in (await recorder.existing()).items()}


async def test_unchanged_records_are_rewritten_about_every_refresh_at_spread_times(bus: Bus):
    clock = _Clock()
    start = clock.now
    recorder = _recorder(bus, clock)
    recorder.set(_records())
    assert await recorder.flush()
    assert set((await _written_at(recorder)).values()) == {start}

    # Half the period on: about half the records were refreshed (not all at once, not none).
    clock.now += REFRESH_S / 2
    assert await recorder.flush()
    refreshed = sum(t > start for t in (await _written_at(recorder)).values())
    assert DEVICES * 0.3 < refreshed < DEVICES * 0.7

    # Ten periods on, flushing every 5 s: each record's rewrites come 0.5-1.5 periods apart
    # (plus the flush step), about one per period on average.
    writes: dict[str, list[float]] = {name: [] for name in _records()}
    for _ in range(int(10 * REFRESH_S / 5)):
        clock.now += 5.0
        assert await recorder.flush()
        for name, at in (await _written_at(recorder)).items():
            if not writes[name] or writes[name][-1] != at:
                writes[name].append(at)
    gaps = [b - a for times in writes.values() for a, b in pairwise(times)]
    assert min(gaps) >= REFRESH_S * 0.5
    assert max(gaps) <= REFRESH_S * 1.5 + 5.0
    assert 0.9 * REFRESH_S < mean(gaps) < 1.15 * REFRESH_S


async def test_a_change_is_written_at_once_whatever_the_refresh(bus: Bus):
    clock = _Clock()
    recorder = _recorder(bus, clock)
    records = _records()
    recorder.set(records)
    assert await recorder.flush()
    clock.now += 1.0
    records["npu-7"].state = health_pb2.HEALTH_STATE_UNHEALTHY
    recorder.set(records)
    assert await recorder.flush(device="npu-7")
    stored = (await recorder.existing())["npu-7"]
    assert stored.state == health_pb2.HEALTH_STATE_UNHEALTHY
    assert stored.updated_unix_ms == int(clock.now * 1000)


async def test_a_flush_is_due_only_for_records_given_since_or_a_refresh(bus: Bus):
    clock = _Clock()
    recorder = _recorder(bus, clock)
    records = _records()
    recorder.set(records)
    assert recorder.due()
    assert await recorder.flush()
    assert not recorder.due()
    first_refresh = clock.now + REFRESH_S * 1.0
    # Every record's first refresh comes within one period: one is due before it ends.
    while not recorder.due():
        clock.now += 1.0
        assert clock.now <= first_refresh
    assert await recorder.flush()
    assert not recorder.due()
    recorder.set(records)  # the evaluator gives records again: a flush looks at them
    assert recorder.due()
    assert await recorder.flush()
    assert not recorder.due()
