"""200 concurrent NodePrepareResources calls (repeats of one UID included): each claim's
devices are prepared exactly once, proven by the agent's write counters, not by timing."""

from __future__ import annotations

import asyncio

import pytest

from services.allocation.claim.checkpoint import ClaimState

pytestmark = pytest.mark.integration

DEVICES = [f"npu-{i}" for i in range(8)]


async def test_concurrent_prepares_prepare_each_claim_exactly_once(plugin_node):
    async with plugin_node.registered() as (agent, kubelet):
        await plugin_node.publish_inventory(*DEVICES)
        await plugin_node.eventually(lambda: agent.inventory.current is not None)
        claims = [plugin_node.allocate(f"c{i}", [DEVICES[i % 8]]) for i in range(150)]
        calls = claims + claims[:25] + claims[:25]  # 200 calls; 25 UIDs asked three times
        answers = await asyncio.gather(*(kubelet.prepare([claim]) for claim in calls))
        by_uid: dict[str, object] = {}
        for claim, answer in zip(calls, answers, strict=True):
            assert answer.claims[claim.uid].error == ""
            assert by_uid.setdefault(claim.uid, answer) == answer, "repeats answer the same"
        for i, claim in enumerate(claims):
            assert agent.cdi.writes[claim.uid] == 1
            assert agent.checkpoints.writes[(claim.uid, ClaimState.PREPARE_STARTED)] == 1
            assert agent.checkpoints.writes[(claim.uid, ClaimState.PREPARE_COMPLETED)] == 1
            devices = answers[i].claims[claim.uid].devices
            assert [d.device_name for d in devices] == [DEVICES[i % 8]]
        assert len(plugin_node.cdi_files()) == len(claims)
