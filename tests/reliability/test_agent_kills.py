"""Each agent SIGKILLed at a random point under load, and restarted: nothing lost or doubled.

`CYCLES` prepare/unprepare cycles run back to back: each prepares `CLAIMS_PER_CYCLE` new claims
in one call while the previous cycle's claims are unprepared in another. During three cycles
drawn from a seeded RNG (reproducible) one agent each is killed with SIGKILL after a random
delay, and started again at once; the kubelet retries failed calls after re-registering, as
the real one does. Afterwards: every answer carried the CDI IDs of the claim's own devices,
the checkpoint holds exactly the claims still prepared (all PrepareCompleted), the CDI
specs likewise, nothing temporary is left, the slices match the profile, and the taints, the
health KV and the kubelet's health stream match the true device health.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence

import pytest

from devcluster.kubelet import KubeletClaim
from devcluster.stack import AGENTS
from services.allocation.cdi import spec_files
from services.allocation.claim.checkpoint import CheckpointStore, ClaimState
from tests.reliability.harness import DRIVER, ReliabilityNode

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(120)]

SEED = 20_260_407
CYCLES = 20
CLAIMS_PER_CYCLE = 4
MAX_KILL_DELAY_S = 0.02
NPUS = [f"npu-{i}" for i in range(8)]
FAULT_AT_START = "gpu-3"
FAULT_AFTER_HEALTH_RESTART = "gpu-1"


def kill_plan(rng: random.Random) -> dict[int, tuple[str, float]]:
    """Cycle -> (agent to kill, delay into the cycle); every agent once, never the last cycle."""
    cycles = rng.sample(range(1, CYCLES - 1), len(AGENTS))
    agents = rng.sample(AGENTS, len(AGENTS))
    return {
        cycle: (agent, rng.uniform(0, MAX_KILL_DELAY_S))
        for cycle, agent in zip(cycles, agents, strict=True)
    }


def _expected_ids(claim: KubeletClaim, device: str) -> list[str]:
    return [spec_files.device_id(DRIVER, spec_files.device_name(claim.uid, device))]


async def _kill_and_restart(node: ReliabilityNode, agent: str, delay_s: float) -> None:
    await asyncio.sleep(delay_s)
    code = await node.stack.kill_agent(agent)
    # -9; 255 when asyncio's child watcher lost the race to reap it and could not tell.
    assert code in (-9, 255), f"{agent} was not killed by SIGKILL (exit {code})"
    if agent == "health":
        node.injected.clear()  # the sim monitor's injected faults died with it
    await node.stack.start_agent(agent)


async def _cycle(
    node: ReliabilityNode,
    devices: dict[str, str],
    *,
    new: Sequence[KubeletClaim],
    old: Sequence[KubeletClaim],
) -> None:
    """Prepare `new` in one call while `old` is unprepared in another."""
    prepared, unprepared = await asyncio.gather(
        node.prepare(new, timeout_s=45), node.unprepare(old, timeout_s=45)
    )
    for claim in new:
        answer = prepared[claim.uid]
        assert answer.error == "", answer.error
        ids = [list(d.cdi_device_ids) for d in answer.devices]
        assert ids == [_expected_ids(claim, devices[claim.uid])]
    assert all(answer.error == "" for answer in unprepared.values())


async def test_sigkill_of_each_agent_under_load_loses_and_doubles_nothing(
    node: ReliabilityNode,
):
    rng = random.Random(SEED)
    plan = kill_plan(rng)
    print(f"kill plan (seed {SEED}): {plan}")
    await node.inject(FAULT_AT_START)
    # Claims are made first, so that the cycles are nothing but back-to-back kubelet calls.
    devices: dict[str, str] = {}
    batches: list[list[KubeletClaim]] = []
    for cycle in range(CYCLES):
        batch = []
        for index in range(CLAIMS_PER_CYCLE):
            device = NPUS[(cycle * CLAIMS_PER_CYCLE + index) % len(NPUS)]
            claim = await node.allocated_claim([device])
            devices[claim.uid] = device
            batch.append(claim)
        batches.append(batch)
    previous: list[KubeletClaim] = []
    for cycle, claims in enumerate(batches):
        work = _cycle(node, devices, new=claims, old=previous)
        if cycle in plan:
            await asyncio.gather(work, _kill_and_restart(node, *plan[cycle]))
        else:
            await work
        previous = claims
    print(f"kubelet calls retried after a kill: {node.retried}")
    assert node.retried >= 1, "the allocation agent's kill hit no call: not under load"

    assert node.stack.exited_agents() == {}
    await node.inject(FAULT_AFTER_HEALTH_RESTART)
    node.assert_prepared_exactly(previous)
    store = CheckpointStore(node.checkpoint_dir)
    store.load()
    assert {r.uid: r.state for r in store.records()} == {
        c.uid: ClaimState.PREPARE_COMPLETED for c in previous
    }
    # A repeated prepare after all the restarts gives the very same answer.
    again = await node.prepare(previous)
    for claim in previous:
        ids = [list(d.cdi_device_ids) for d in again[claim.uid].devices]
        assert ids == [_expected_ids(claim, devices[claim.uid])]
    await node.wait_slices_match_profile()
    assert await node.wait_health_converged() == {FAULT_AFTER_HEALTH_RESTART}

    await node.unprepare(previous)
    node.assert_prepared_exactly([])
