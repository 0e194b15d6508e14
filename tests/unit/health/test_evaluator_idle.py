"""The evaluator on an idle node: a pass whose inputs are those of a pass that changed nothing
judges nothing again (the records are only flushed when a refresh is due), a settled evaluator
sleeps for several poll intervals and wakes for news, and everything
that can change a verdict or a record without news still does at the next pass: the end of a
recovery hold, taint rules becoming available, a drain, a new view. The KV, the taint writer,
Events and alerts are stood in for by recording fakes."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Iterable, Mapping
from typing import Any, cast

from services.health.evaluator import HealthEvaluator
from services.health.policy import Health, PolicySettings, Taint
from shared.pb.drasuite.v1 import health_pb2
from shared.vendors.parts.observation import Fault, Observation, Observations
from tests.unit.health.evaluator_sink import Sink

DRIVER = "sim.dra-suite.io"
NODE = "node-a"
XID = Fault(cause="xid", code="79", message="fallen off the bus")


class Recorder:
    def __init__(self) -> None:
        self.records: dict[str, health_pb2.DeviceHealth] = {}
        self.sets = 0
        self.flushes = 0
        self.next_refresh = math.inf
        self.refresh_due = False

    async def existing(self) -> dict[str, health_pb2.DeviceHealth]:
        return {}

    def set(self, records: Mapping[str, health_pb2.DeviceHealth]) -> None:
        self.records = dict(records)
        self.sets += 1

    def due(self) -> bool:
        return self.sets > self.flushes or self.refresh_due

    async def flush(self, *, device: str | None = None) -> bool:
        self.flushes += 1
        return True


class Taints:
    """Taint rules that become available (or not) and drains, as the taint writer has them."""

    def __init__(self) -> None:
        self.available = True
        self.drained: dict[str, Taint] = {}
        self.wanted: dict[str, Taint] = {}

    def want(self, taints: Mapping[str, Taint], *, pool: str, contexts: Any) -> None:
        self.wanted = dict(taints)

    def restore(self, device: str, taints: Iterable[Taint]) -> None:
        pass

    def applied(self, taint: Taint | None) -> Taint | None:
        return taint if self.available else None

    def drain_taint(self, device: str) -> Taint | None:
        return self.drained.get(device)

    def answers_from(self) -> tuple[object, ...]:
        return (self.available, tuple(sorted(self.drained.items())))


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def evaluator(
    *, recovery_hold_s: float = 0.0, poll_interval_s: float = 1.0, clock: Any = None
) -> tuple[HealthEvaluator, Recorder, Taints, Clock]:
    recorder, taints, clock = Recorder(), Taints(), clock or Clock()
    found = HealthEvaluator(
        settings=PolicySettings(driver=DRIVER, recovery_hold_s=recovery_hold_s),
        node=NODE,
        recorder=cast(Any, recorder),
        taints=cast(Any, taints),
        events=cast(Any, Sink()),
        alerts=cast(Any, Sink()),
        poll_interval_s=poll_interval_s,
        clock=clock,
    )
    return found, recorder, taints, clock


def view(*devices: str, faulty: Mapping[str, Fault] = {}) -> Observations:
    return Observations(
        pool=NODE, devices=tuple(Observation(device=d, fault=faulty.get(d)) for d in devices)
    )


async def passes(agent: HealthEvaluator, clock: Clock, count: int) -> None:
    for _ in range(count):
        clock.now += 1.0
        await agent.evaluate()


async def test_an_idle_pass_judges_nothing_again_and_flushes_only_a_due_refresh() -> None:
    agent, recorder, _, clock = evaluator()
    agent.observe(view("gpu-0", "gpu-1"))
    await passes(agent, clock, 2)  # the first pass finds the devices, the second nothing new
    judged, flushed = recorder.sets, recorder.flushes
    # The monitor reports the same view again, as a new object: still nothing to judge.
    agent.observe(view("gpu-0", "gpu-1"))
    await passes(agent, clock, 5)
    assert (recorder.sets, recorder.flushes, agent.evaluations) == (judged, flushed, 7)
    recorder.refresh_due = True  # a record's refresh comes: the next pass flushes, judges not
    await passes(agent, clock, 1)
    assert (recorder.sets, recorder.flushes) == (judged, flushed + 1)
    assert {d: s.health for d, s in agent.states.items()} == {
        "gpu-0": Health.HEALTHY,
        "gpu-1": Health.HEALTHY,
    }


async def test_a_fault_after_idle_passes_is_judged_at_once() -> None:
    agent, recorder, taints, clock = evaluator()
    agent.observe(view("gpu-0", "gpu-1"))
    await passes(agent, clock, 4)
    agent.observe(view("gpu-0", "gpu-1", faulty={"gpu-1": XID}))
    await passes(agent, clock, 1)
    assert agent.states["gpu-1"].health is Health.UNHEALTHY
    assert recorder.records["gpu-1"].code == "79"
    assert [t.key for t in taints.wanted.values()] == [f"{DRIVER}/xid"]


async def test_a_recovery_hold_ends_on_time_without_news() -> None:
    agent, recorder, taints, clock = evaluator(recovery_hold_s=30.0)
    agent.observe(view("gpu-0", faulty={"gpu-0": XID}))
    await passes(agent, clock, 1)
    agent.observe(view("gpu-0"))  # healthy again: the hold starts
    await passes(agent, clock, 10)
    held = agent.states["gpu-0"].health
    clock.now += 30.0
    await agent.evaluate()
    assert (held, agent.states["gpu-0"].health) == (Health.UNHEALTHY, Health.HEALTHY)
    assert taints.wanted == {}
    assert recorder.records["gpu-0"].taint == ""


async def test_taint_rules_becoming_available_reach_the_record_without_news() -> None:
    agent, recorder, taints, clock = evaluator()
    taints.available = False
    agent.observe(view("gpu-0", faulty={"gpu-0": XID}))
    await passes(agent, clock, 3)
    assert recorder.records["gpu-0"].taint == ""
    taints.available = True  # the taint writer negotiated a served version meanwhile
    await passes(agent, clock, 1)
    assert recorder.records["gpu-0"].taint == f"{DRIVER}/xid=79:NoSchedule"


async def test_a_drain_reaches_the_record_at_the_next_pass() -> None:
    agent, recorder, taints, clock = evaluator()
    agent.observe(view("gpu-0"))
    await passes(agent, clock, 3)
    drain = Taint(key=f"{DRIVER}/drain", value="maintenance", effect="NoSchedule")
    taints.drained["gpu-0"] = drain
    await passes(agent, clock, 1)
    assert [t.key for t in recorder.records["gpu-0"].taints] == [drain.key]


async def test_a_settled_evaluator_sleeps_longer_than_the_poll_and_wakes_for_news() -> None:
    agent, recorder, _, _ = evaluator(poll_interval_s=0.02, clock=time.time)
    agent.observe(view("gpu-0", "gpu-1"))
    runner = asyncio.create_task(agent.run())
    try:
        await asyncio.sleep(1.0)
        # Unsettled it would pass 50 times; settled, every 10 poll intervals (0.2 s).
        assert agent.evaluations <= 9
        agent.observe(view("gpu-0", "gpu-1", faulty={"gpu-0": XID}))
        await asyncio.sleep(0.05)
        assert agent.states["gpu-0"].health is Health.UNHEALTHY
        assert recorder.records["gpu-0"].code == "79"
    finally:
        runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runner
