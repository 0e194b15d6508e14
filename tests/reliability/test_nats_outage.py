"""NATS is killed (SIGKILL) for `OUTAGE_S` while the node keeps working, then comes back.

During the outage the kubelet prepares new claims (they must all succeed from the allocation
agent's last inventory) and a GPU is hot-plugged (its slice reaches the API at once, its
inventory once NATS is back). A fault is injected just before the kill (its alert may be in
flight when NATS dies) and another right after NATS returns (the fault-control subject is
NATS itself). Afterwards: every agent reconnected by itself (same PIDs, none exited), the
alert stream holds exactly one RAISED per fault, and the health KV, the kubelet's health
stream and the DeviceTaintRules all say exactly the injected faults.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest

from devcluster.flow import FlowError
from devcluster.kubelet import KubeletClaim
from devcluster.natsserver import NATSServerProcess
from shared.errors import BusUnavailableError
from tests.reliability.harness import ReliabilityNode, hot_plug, until

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(120)]

OUTAGE_S = 20.0
"""How long NATS stays dead (issue 7: 20 s)."""
PREPARES_DURING_OUTAGE = 5
FAULT_BEFORE = "npu-1"
FAULT_AFTER = "gpu-0"
PLUGGED = "gpu-4"


async def _inject_when_reachable(node: ReliabilityNode, device: str) -> None:
    """The first fault command after NATS returns: retried until the health agent answers."""

    async def attempt() -> bool:
        try:
            await node.inject(device)
        except (BusUnavailableError, FlowError, TimeoutError):
            return False
        return True

    await until(attempt, what=f"fault command for {device} answered", timeout_s=20)


async def _outage(node: ReliabilityNode) -> list[KubeletClaim]:
    """Kill NATS, work through the outage, bring NATS back; the claims prepared meanwhile."""
    nats = node.stack.nats
    assert isinstance(nats, NATSServerProcess), "the outage is of one server, not a cluster"
    await node.inject(FAULT_BEFORE)
    await asyncio.to_thread(nats.kill)
    killed = time.monotonic()
    hot_plug(node.profile, PLUGGED)
    prepared = []
    for index in range(PREPARES_DURING_OUTAGE):
        claim = await node.allocated_claim([f"npu-{index + 2}"])
        answer = (await node.prepare([claim]))[claim.uid]
        assert answer.error == "", f"prepare during the outage failed: {answer.error}"
        prepared.append(claim)

    async def plugged() -> bool:
        return PLUGGED in await node.slice_devices()

    # The API is up: the hot-plugged GPU's slice does not wait for NATS.
    await until(plugged, what=f"{PLUGGED} in the slices", timeout_s=10)
    assert time.monotonic() - killed < OUTAGE_S, "the outage work took longer than the outage"
    await asyncio.sleep(OUTAGE_S - (time.monotonic() - killed))
    await asyncio.to_thread(nats.start)
    return prepared


async def test_agents_ride_out_a_nats_outage_and_lose_no_alert(node: ReliabilityNode):
    pids = node.stack.agent_pids()
    before = await node.allocated_claim(["npu-0"])
    assert (await node.prepare([before]))[before.uid].error == ""

    prepared = await _outage(node)
    assert len(prepared) == PREPARES_DURING_OUTAGE
    await until(node.bus.connected.wait, what="the test's own NATS client back", timeout_s=15)
    await _inject_when_reachable(node, FAULT_AFTER)

    # Reconnected without a restart: same processes, none exited.
    assert node.stack.agent_pids() == pids
    assert node.stack.exited_agents() == {}
    # The inventory change made during the outage reached NATS, and the allocation agent.
    await node.wait_slices_match_profile()
    late = await node.allocated_claim([PLUGGED])
    assert (await node.prepare([late]))[late.uid].error == ""

    assert await node.wait_health_converged() == {FAULT_BEFORE, FAULT_AFTER}
    want = Counter({(FAULT_BEFORE, "RAISED"): 1, (FAULT_AFTER, "RAISED"): 1})
    await until(lambda: _counts_are(node, want), what=f"alerts {dict(want)}", timeout_s=15)
    await asyncio.sleep(2)  # a late duplicate (a queued retry) would land in this time
    assert await node.alert_counts() == want
    assert len({a.id for a in await node.alerts()}) == sum(want.values())

    node.assert_prepared_exactly([before, *prepared, late])


async def _counts_are(node: ReliabilityNode, want: Counter[tuple[str, str]]) -> bool:
    return await node.alert_counts() == want
