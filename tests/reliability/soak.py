"""The soak: a whole node (every agent a process) under steady prepare/unprepare churn with
periodic faults, watched for leaks of memory, file descriptors and asyncio tasks.

Run by tests/reliability/test_soak.py (60 s in CI, 10 minutes opt-in) and by bench/soak.py
(`soak_rss_growth_mb` and its neighbours in bench/results.json), both through `run_soak`.

Churn: a new claim every 1/`rate_per_s` seconds, each on a device of its own (leased from a
free list, so no device is in two claims at once, as the scheduler guarantees), made and
allocated with the reliability harness's helper, prepared through the kubelet emulator, held
`hold_s`, unprepared and deleted. A prepare answered with an error is retried, as the kubelet
retries a pod's prepare.

Faults, one per `fault_period_s` in turn, each undone before the next one starts:
- device fault: a FaultCommand over NATS (the dractl path), cleared after `fault_hold_s`;
- hot-plug: a GPU with a fresh name joins the sim profile and leaves it `fault_hold_s` later;
- API fault: every GET of a ResourceClaim answers 500 for `fault_hold_s`;
- watch cut: the API emulator ends every open watch (the agents re-watch).
Meanwhile a second kubelet connection keeps a health stream (NodeWatchResources) open.

What counts as a failure: every unprepare must succeed, and so must every kubelet call (no
agent is killed here, so a gRPC-level failure is a bug). A prepare may fail only when its
answer says the claim could not be read (`ClaimReader`: "reading it failed") and the call
overlapped an API fault window; that is a legitimate failure, and the retry after the window
must succeed. Anything else is an unexpected failure.

Leaks: each agent is sampled every `sample_period_s` (RSS, fds, tasks). The first `warmup_s` of
churn is warm-up (caches, pools and first-time fault paths fill; one fault cycle fits in it).
RSS growth is the median of the last `window_s` minus the median of the `window_s` right after
the warm-up (a window spans whole fault cycles, so both see the same mix); task growth compares
the two windows' floors (their least counts). Fds and tasks are also counted at rest before the
churn and again at rest after it (given up to `settle_s` for kept-alive connections to time
out), and must come back to their resting level.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import yaml

from devcluster import flow
from devcluster.kubelet import KubeletClaim, KubeletEmulator
from devcluster.stack import AGENTS
from shared.kube import resources
from tests.reliability.harness import (
    DRIVER,
    ReliabilityNode,
    hot_plug,
    profile_devices,
    write_profile,
)
from tests.reliability.soak_probe import (
    AgentProbe,
    ProcessSample,
    least_between,
    median_between,
)

__all__ = ["CI_PLAN", "LONG_PLAN", "AgentFigures", "SoakPlan", "SoakReport", "run_soak"]

EXTRA_GPUS = 12
"""GPUs hot-plugged before the soak: 24 devices let 50 claims/s each hold one of their own."""
FAULT_DEVICES = [*(f"npu-{i}" for i in range(8)), *(f"gpu-{i}" for i in range(4))]
READ_FAILED = "reading it failed"
"""What `ClaimReader` says when it could not GET the claim: the API fault's legitimate failure."""
PREPARE_RETRY_S = 0.2
PREPARE_DEADLINE_S = 30.0
MAX_LAG_S = 1.0
"""A churn that fell behind (no free device) catches up at most this much, not in one burst."""


def p99(samples: list[float]) -> float:
    """Nearest-rank 99th percentile; 0 without samples."""
    if not samples:
        return 0.0
    ordered = sorted(samples)
    return ordered[max(1, math.ceil(0.99 * len(ordered))) - 1]


@dataclass(frozen=True, slots=True)
class SoakPlan:
    duration_s: float
    warmup_s: float
    window_s: float
    rate_per_s: float = 50.0
    hold_s: float = 0.1
    fault_period_s: float = 3.0
    fault_hold_s: float = 1.0
    sample_period_s: float = 1.0
    settle_s: float = 30.0
    fd_slack: int = 0
    task_slack: int = 0
    task_growth_slack: float | None = None
    """How far the task floor under load may climb from the first window to the last; None
    where the windows are too short for a floor to be quiet (one 12 s window may catch a burst
    of calls in flight on a loaded machine). The at-rest comparison is the leak check there."""


# Four faults of 3 s: a cycle of 12 s, inside the warm-up and as long as a window (or five).
CI_PLAN = SoakPlan(duration_s=60.0, warmup_s=15.0, window_s=12.0)
LONG_PLAN = SoakPlan(duration_s=600.0, warmup_s=60.0, window_s=60.0, task_growth_slack=2.0)


@dataclass(frozen=True, slots=True)
class AgentFigures:
    agent: str
    rss_early_mb: float
    rss_late_mb: float
    tasks_early: float
    tasks_late: float
    """The least task count in each window: what stays when in-flight calls are fewest. A
    median follows the load (one task per call in flight, more when a busy machine slows the
    agent); a leak lifts the floor."""
    rest_before: ProcessSample
    rest_after: ProcessSample
    pids: frozenset[int]
    """Every pid seen: one, unless the agent restarted (which would void its figures)."""

    @property
    def rss_growth_mb(self) -> float:
        return self.rss_late_mb - self.rss_early_mb

    @property
    def task_growth(self) -> float:
        return self.tasks_late - self.tasks_early

    @property
    def fd_delta(self) -> int:
        return self.rest_after.fds - self.rest_before.fds

    @property
    def task_delta(self) -> int:
        return self.rest_after.tasks - self.rest_before.tasks

    def summary(self) -> str:
        return (
            f"{self.agent}: rss {self.rss_early_mb:.1f} -> {self.rss_late_mb:.1f} MiB "
            f"({self.rss_growth_mb:+.2f}), tasks {self.tasks_early:g} -> {self.tasks_late:g}, "
            f"at rest fds {self.rest_before.fds} -> {self.rest_after.fds}, "
            f"tasks {self.rest_before.tasks} -> {self.rest_after.tasks}"
        )


@dataclass
class SoakReport:
    plan: SoakPlan
    churn_s: float
    claims_started: int
    claims_cycled: int
    prepare_ms: list[float]
    legitimate_failures: int
    unexpected_failures: list[str]
    kubelet_retries: int
    faults: Counter[str]
    health_messages: int
    agents: dict[str, AgentFigures]
    samples: dict[str, list[ProcessSample]]

    @property
    def claims_per_s(self) -> float:
        return self.claims_cycled / self.churn_s

    @property
    def max_rss_growth_mb(self) -> float:
        return max(a.rss_growth_mb for a in self.agents.values())

    def summary(self) -> str:
        lines = [
            f"soak {self.churn_s:.1f}s: {self.claims_cycled}/{self.claims_started} claims cycled "
            f"({self.claims_per_s:.1f}/s), prepare p99 {p99(self.prepare_ms):.1f} ms, "
            f"{self.legitimate_failures} legitimate prepare failures, "
            f"{len(self.unexpected_failures)} unexpected, {self.kubelet_retries} kubelet "
            f"retries, faults {dict(self.faults)}, {self.health_messages} health messages",
            *(a.summary() for a in self.agents.values()),
            *(f"unexpected: {failure}" for failure in self.unexpected_failures[:20]),
        ]
        return "\n".join(lines)

    def as_results(self) -> dict[str, float]:
        """The figures for bench/results.json."""
        results: dict[str, float] = {
            "soak_duration_s": self.plan.duration_s,
            "soak_claims_per_s": round(self.claims_per_s, 1),
            "soak_claims_cycled": self.claims_cycled,
            "soak_prepare_p99_ms": round(p99(self.prepare_ms), 3),
            "soak_prepare_failures_legitimate": self.legitimate_failures,
            "soak_prepare_failures_unexpected": len(self.unexpected_failures),
            "soak_faults": sum(self.faults.values()),
            "soak_rss_growth_mb": round(self.max_rss_growth_mb, 2),
        }
        for name, agent in self.agents.items():
            results[f"soak_rss_growth_mb_{name}"] = round(agent.rss_growth_mb, 2)
            results[f"soak_fd_delta_{name}"] = agent.fd_delta
            results[f"soak_task_delta_{name}"] = agent.task_delta
            results[f"soak_task_growth_{name}"] = agent.task_growth
        return results


@dataclass
class _Windows:
    """When the API fault was in force (monotonic); an open one ends at infinity."""

    spans: list[list[float]] = field(default_factory=list)

    def open(self) -> None:
        self.spans.append([time.monotonic(), math.inf])

    def close(self) -> None:
        self.spans[-1][1] = time.monotonic()

    def overlap(self, start: float, end: float) -> bool:
        return any(opened <= end and start <= closed for opened, closed in self.spans)


@dataclass
class _Churn:
    node: ReliabilityNode
    plan: SoakPlan
    api_faults: _Windows
    free: asyncio.Queue[str] = field(default_factory=asyncio.Queue)
    started: int = 0
    cycled: int = 0
    prepare_ms: list[float] = field(default_factory=list)
    legitimate: int = 0
    unexpected: list[str] = field(default_factory=list)

    async def run(self, until: float) -> None:
        loop = asyncio.get_running_loop()
        interval = 1 / self.plan.rate_per_s
        due = loop.time()
        async with asyncio.TaskGroup() as lifecycles:
            while loop.time() < until:
                await asyncio.sleep(max(0.0, due - loop.time()))
                device = await self.free.get()
                self.started += 1
                lifecycles.create_task(self._lifecycle(device))
                due = max(due + interval, loop.time() - MAX_LAG_S)

    async def _lifecycle(self, device: str) -> None:
        claim: KubeletClaim | None = None
        try:
            claim = await self.node.allocated_claim([device])
            await self._prepare(claim, device)
            await asyncio.sleep(self.plan.hold_s)
            answer = (await self.node.unprepare([claim]))[claim.uid]
            if answer.error:
                self.unexpected.append(f"unprepare {claim.name}: {answer.error}")
            else:
                self.cycled += 1
        except Exception as exc:  # recorded, so the soak goes on and reports everything
            self.unexpected.append(f"claim on {device}: {type(exc).__name__}: {exc}")
        finally:
            self.free.put_nowait(device)
        if claim is not None:
            with contextlib.suppress(Exception):  # a claim left behind is only clutter
                await self.node.kube.delete(
                    resources.RESOURCE_CLAIMS, claim.name, namespace=claim.namespace
                )

    async def _prepare(self, claim: KubeletClaim, device: str) -> None:
        deadline = time.monotonic() + PREPARE_DEADLINE_S
        while True:
            started = time.monotonic()
            answer = (await self.node.prepare([claim]))[claim.uid]
            ended = time.monotonic()
            if not answer.error:
                got = [d.device_name for d in answer.devices]
                if got != [device]:
                    self.unexpected.append(f"prepare {claim.name}: devices {got}, not {device}")
                self.prepare_ms.append((ended - started) * 1000)
                return
            if READ_FAILED in answer.error and self.api_faults.overlap(started, ended):
                self.legitimate += 1
            else:
                self.unexpected.append(f"prepare {claim.name}: {answer.error}")
            if ended >= deadline:
                self.unexpected.append(f"prepare {claim.name}: never succeeded")
                return
            await asyncio.sleep(PREPARE_RETRY_S)


@dataclass
class _Faults:
    node: ReliabilityNode
    plan: SoakPlan
    api_faults: _Windows
    done: Counter[str] = field(default_factory=Counter)

    async def run(self, until: float) -> None:
        kinds: list[tuple[str, Callable[[int], Awaitable[None]]]] = [
            ("device_fault", self._device_fault),
            ("hot_plug", self._hot_plug),
            ("api_fault", self._api_fault),
            ("watch_cut", self._watch_cut),
        ]
        loop = asyncio.get_running_loop()
        for n in itertools.count():
            slot_ends = loop.time() + self.plan.fault_period_s
            if slot_ends > until:
                return
            name, fault = kinds[n % len(kinds)]
            await fault(n // len(kinds))
            self.done[name] += 1
            await asyncio.sleep(max(0.0, slot_ends - loop.time()))

    async def _device_fault(self, n: int) -> None:
        device = FAULT_DEVICES[n % len(FAULT_DEVICES)]
        await self.node.inject(device)
        await asyncio.sleep(self.plan.fault_hold_s)
        await self.node.inject(device, clear=True)

    async def _hot_plug(self, n: int) -> None:
        profile = self.node.profile
        before = yaml.safe_load(profile.read_text())
        hot_plug(profile, f"soak-plug-{n}")
        await asyncio.sleep(self.plan.fault_hold_s)
        write_profile(profile, before)

    async def _api_fault(self, _: int) -> None:
        self.api_faults.open()
        try:
            await self.node.api.add_faults(
                [{"resource": "resourceclaims", "verb": "get", "status": 500}]
            )
            await asyncio.sleep(self.plan.fault_hold_s)
        finally:
            await self.node.api.clear_faults()
            self.api_faults.close()

    async def _watch_cut(self, _: int) -> None:
        await self.node.api.close_watches()


async def _rest(probe: AgentProbe, *, at_s: float) -> dict[str, ProcessSample]:
    return {agent: await probe.sample(agent, at_s=at_s) for agent in AGENTS}


async def _sample_until(
    probe: AgentProbe,
    samples: list[ProcessSample],
    agent: str,
    *,
    t0: float,
    until: float,
    period_s: float,
) -> None:
    loop = asyncio.get_running_loop()
    while loop.time() < until:
        samples.append(await probe.sample(agent, at_s=loop.time() - t0))
        await asyncio.sleep(period_s)


async def _settled(
    probe: AgentProbe, before: dict[str, ProcessSample], plan: SoakPlan, *, at_s: float
) -> dict[str, ProcessSample]:
    """Resting figures once fds and tasks are back within slack (or `settle_s` has passed:
    kept-alive API connections of a busy agent close after the client's keep-alive timeout)."""
    deadline = time.monotonic() + plan.settle_s
    while True:
        after = await _rest(probe, at_s=at_s)
        back = all(
            after[a].fds <= before[a].fds + plan.fd_slack
            and after[a].tasks <= before[a].tasks + plan.task_slack
            for a in AGENTS
        )
        if back or time.monotonic() >= deadline:
            return after
        await asyncio.sleep(1.0)


async def _setup(node: ReliabilityNode) -> list[str]:
    """Hot-plug the extra GPUs; the devices the churn leases, once the node has them all."""
    for index in range(EXTRA_GPUS):
        hot_plug(node.profile, f"soak-gpu-{100 + index}")
    await node.wait_slices_match_profile()
    await node.wait_health_converged()
    return sorted(profile_devices(node.profile))


async def _converge(node: ReliabilityNode, devices: list[str]) -> None:
    """The end state: nothing prepared, slices as the profile, no fault left anywhere."""
    node.assert_prepared_exactly([])
    assert sorted(await node.wait_slices_match_profile()) == devices
    assert await node.wait_health_converged() == set()


async def run_soak(node: ReliabilityNode, plan: SoakPlan) -> SoakReport:
    devices = await _setup(node)
    loop = asyncio.get_running_loop()
    async with AgentProbe(node.stack) as probe:
        before = await _rest(probe, at_s=-1.0)
        api_faults = _Windows()
        churn = _Churn(node, plan, api_faults)
        for device in devices:
            churn.free.put_nowait(device)
        faults = _Faults(node, plan, api_faults)
        watcher = KubeletEmulator(node.stack.config.registry_dir, call_timeout_s=10)
        await watcher.register(driver=DRIVER, timeout_s=30)
        health = flow.HealthStreamRecorder(watcher)
        samples: dict[str, list[ProcessSample]] = {agent: [] for agent in AGENTS}
        t0 = loop.time()
        until = t0 + plan.duration_s
        stream = asyncio.create_task(health.run())
        try:
            # Ends once the churn's last claim and the last fault are done.
            async with asyncio.TaskGroup() as tg:
                tg.create_task(churn.run(until))
                tg.create_task(faults.run(until))
                for agent in AGENTS:
                    tg.create_task(
                        _sample_until(
                            probe,
                            samples[agent],
                            agent,
                            t0=t0,
                            until=until,
                            period_s=plan.sample_period_s,
                        )
                    )
        finally:
            stream.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await stream  # a stream that broke on its own raises its KubeletError here
            await watcher.close()
        churn_s = loop.time() - t0
        await _converge(node, devices)
        after = await _settled(probe, before, plan, at_s=churn_s)
    late_start = plan.duration_s - plan.window_s
    early = (plan.warmup_s, plan.warmup_s + plan.window_s)
    figures = {
        agent: AgentFigures(
            agent=agent,
            rss_early_mb=median_between(samples[agent], "rss_mb", start_s=early[0], end_s=early[1]),
            rss_late_mb=median_between(
                samples[agent], "rss_mb", start_s=late_start, end_s=plan.duration_s
            ),
            tasks_early=least_between(samples[agent], "tasks", start_s=early[0], end_s=early[1]),
            tasks_late=least_between(
                samples[agent], "tasks", start_s=late_start, end_s=plan.duration_s
            ),
            rest_before=before[agent],
            rest_after=after[agent],
            pids=frozenset(s.pid for s in (before[agent], *samples[agent], after[agent])),
        )
        for agent in AGENTS
    }
    return SoakReport(
        plan=plan,
        churn_s=churn_s,
        claims_started=churn.started,
        claims_cycled=churn.cycled,
        prepare_ms=churn.prepare_ms,
        legitimate_failures=churn.legitimate,
        unexpected_failures=churn.unexpected,
        kubelet_retries=node.retried,
        faults=faults.done,
        health_messages=health.messages,
        agents=figures,
        samples=samples,
    )
