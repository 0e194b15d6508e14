"""API server faults: the slice publisher and the taint writer back off and converge.

Each case injects one kind of failure on the writes of one resource (over the emulator's
`/_emulator/faults`), then changes what that resource must say: a GPU is hot-plugged (new
slice content) and a device faults (a new DeviceTaintRule). For `WINDOW_S` every write fails;
the writes in that window are counted from the request log and must stay within what the
writer's backoff allows (a hot loop makes hundreds). After the faults are cleared the slices
must match the profile and the taints the true health, with no duplicate.

Watches are cut mid-stream (every watch, and a rule cutting each new one), with a 410 Gone on
the re-watch: the reconciler relists, keeps following, and re-creates wiped slices.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import pytest

from tests.reliability.emulator_control import SLICES, TAINT_RULES, write_rules
from tests.reliability.harness import NODE, ReliabilityNode, hot_plug, profile_devices, until

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(120)]

Obj = dict[str, Any]

WINDOW_S = 5.0
"""How long the writes of the faulted resource are counted, from the first one."""
FAULTY = "npu-3"
PLUGGED = "gpu-4"
RETRY_AFTER_S = 3
"""Long enough that a writer ignoring Retry-After (its own backoff: 5-7 tries in the window)
is told apart from one honouring it (2 tries)."""
KUBE_TIMEOUT_S = 1.0
"""The agents' API request timeout here, so that a slow answer is a timeout (default 10 s)."""
STACK = {
    "extra_args": tuple(
        (agent, ("--kube-request-timeout-s", str(KUBE_TIMEOUT_S)))
        for agent in ("discovery", "health")
    )
}
# Initial backoff of each writer (SliceReconciler: 0.1 s, TaintWriter: 0.2 s).
INITIAL_BACKOFF_S = {SLICES: 0.1, TAINT_RULES: 0.2}


def attempts_allowed(*, initial_s: float, window_s: float, at_least_s: float = 0.0) -> int:
    """How many tries `shared.backoff.Backoff(initial_s, max_s=10)` lets through in `window_s`
    at most: every delay at its least (half its base: the jitter covers the upper half), and
    never less than `at_least_s` (Retry-After)."""
    elapsed, attempts, base = 0.0, 1, initial_s
    while True:
        elapsed += max(at_least_s, min(10.0, base) / 2)
        if elapsed >= window_s:
            return attempts
        attempts += 1
        base *= 2


async def _writes_in_window(node: ReliabilityNode, resource: str, *, after: float) -> list[Obj]:
    """The writes of `resource` in the `WINDOW_S` that starts with its first write after
    `after` (so a slow start on a busy machine does not shorten the window)."""

    async def first() -> float | None:
        writes = await node.api.writes(resource, since=after)
        return min((w["timestamp"] for w in writes), default=None)

    opened = await until(first, what=f"a write to {resource}", timeout_s=15)
    await asyncio.sleep(max(0.0, opened + WINDOW_S - time.time()))
    return await node.api.writes(resource, since=opened, until=opened + WINDOW_S)


@dataclass(frozen=True)
class Case:
    resource: str
    fault: dict[str, Any]
    at_least_s: float = 0.0
    """The least delay between tries (Retry-After; a timeout's own duration)."""


CASES = {
    "500 on slice writes": Case(SLICES, {"status": 500}),
    "429 with Retry-After on slice writes": Case(
        SLICES, {"status": 429, "retry_after_s": RETRY_AFTER_S}, at_least_s=RETRY_AFTER_S
    ),
    "409 storm on slice writes": Case(SLICES, {"status": 409}),
    "timeouts on slice writes": Case(SLICES, {"latency_s": 2.0}, at_least_s=KUBE_TIMEOUT_S),
    "500 on taint rule writes": Case(TAINT_RULES, {"status": 500}),
    "429 with Retry-After on taint rule writes": Case(
        TAINT_RULES, {"status": 429, "retry_after_s": RETRY_AFTER_S}, at_least_s=RETRY_AFTER_S
    ),
    "409 storm on taint rule writes": Case(TAINT_RULES, {"status": 409}),
    "timeouts on taint rule writes": Case(
        TAINT_RULES, {"latency_s": 2.0}, at_least_s=KUBE_TIMEOUT_S
    ),
}


@pytest.mark.parametrize("node", [STACK], indirect=True, ids=["short-timeouts"])
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
async def test_writers_back_off_under_api_faults_and_converge(node: ReliabilityNode, case: Case):
    started = time.time()
    await node.api.add_faults(write_rules(case.resource, **case.fault))
    hot_plug(node.profile, PLUGGED)
    await node.inject(FAULTY)
    writes = await _writes_in_window(node, case.resource, after=started)
    await node.api.clear_faults()

    allowed = attempts_allowed(
        initial_s=INITIAL_BACKOFF_S[case.resource], window_s=WINDOW_S, at_least_s=case.at_least_s
    )
    figures = f"{len(writes)} writes in {WINDOW_S}s, backoff allows {allowed} tries"
    print(f"{case.resource} {case.fault}: {figures}")
    assert len(writes) >= 2, f"the writer gave up instead of retrying: {figures}"
    # One write per try, plus one for a try cut by the window's edge. A hot loop makes hundreds.
    assert len(writes) <= allowed + 1, figures

    await node.wait_slices_match_profile()
    assert await node.wait_health_converged() == {FAULTY}


async def test_watches_cut_mid_stream_and_a_410_on_rewatch_are_survived(node: ReliabilityNode):
    started = time.time()
    await node.api.add_faults(
        [
            {"resource": SLICES, "verb": "watch", "status": 410, "times": 1},
            {"resource": SLICES, "verb": "watch", "cut_watch_after_s": 0.5},
        ]
    )
    assert await node.api.close_watches() >= 1
    await asyncio.sleep(1.0)
    hot_plug(node.profile, PLUGGED)
    await node.wait_slices_match_profile()
    await node.api.wipe_slices(NODE)  # the reconciler learns this only through its watch
    await node.wait_slices_match_profile(timeout_s=10)
    elapsed = time.time() - started
    # The reconciler's own calls: it selects by node and driver (the test's lists by node).
    ours = [
        r
        for r in await node.api.requests(resource=SLICES)
        if "spec.driver=" in r["query"].get("fieldSelector", "") and r["timestamp"] >= started
    ]
    rewatches = [r for r in ours if r["verb"] == "watch"]
    relists = [r for r in ours if r["verb"] == "list"]
    print(f"watch cuts over {elapsed:.1f}s: {len(rewatches)} watches, {len(relists)} lists")
    assert any(r["status"] == 410 for r in rewatches), "the 410 rule never fired"
    # One re-watch per cut (every 0.5 s) and one relist after the 410: no tight loop.
    assert len(rewatches) <= 2 * elapsed / 0.5 + 4
    assert 1 <= len(relists) <= 5
    await node.api.clear_faults()
    assert await node.slice_devices() == sorted(profile_devices(node.profile))
    await until(node.bus.connected.wait, what="NATS connected", timeout_s=5)
