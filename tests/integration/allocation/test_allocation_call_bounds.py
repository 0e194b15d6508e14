"""One NodePrepareResources call answers every claim in time and within the kubelet's limits.

A claim GET throttled with `Retry-After: 120` must not hold the call past the kubelet's
deadline: that claim gets its own error, the others their answers. A claim name of 2 MiB
(echoed in its error) must not push the answer past the 4 MiB the kubelet's client accepts.
"""

from __future__ import annotations

import time

import pytest

from devcluster.kubelet import KubeletClaim

pytestmark = pytest.mark.integration

CALL_DEADLINE_S = 6.0
"""The kubelet emulator's deadline here (the kubelet's is 45 s): the plugin reads it."""


async def _ready(plugin_node, agent) -> None:
    await plugin_node.publish_inventory("npu-0", "npu-1")
    await plugin_node.eventually(lambda: agent.inventory.current is not None)


def _throttle(plugin_node, name: str, *, times: int | None) -> None:
    plugin_node.api.faults.add(
        verb="get",
        resource="resourceclaims",
        name=name,
        status=429,
        retry_after_s=120,
        times=times,
    )


async def test_a_claim_throttled_past_the_deadline_fails_alone_before_it(plugin_node):
    async with plugin_node.registered() as (agent, kubelet):
        kubelet.call_timeout_s = CALL_DEADLINE_S
        await _ready(plugin_node, agent)
        good = plugin_node.allocate("good", ["npu-0"])
        throttled = plugin_node.allocate("throttled", ["npu-1"])
        _throttle(plugin_node, "throttled", times=None)
        started = time.monotonic()
        answers = (await kubelet.prepare([good, throttled])).claims
        assert time.monotonic() - started < CALL_DEADLINE_S
        assert answers[good.uid].error == ""
        assert [d.device_name for d in answers[good.uid].devices] == ["npu-0"]
        assert "429" in answers[throttled.uid].error
        assert plugin_node.spec(throttled.uid) is None


async def test_a_long_retry_after_is_capped_and_the_claim_prepared_in_the_same_call(plugin_node):
    async with plugin_node.registered() as (agent, kubelet):
        kubelet.call_timeout_s = CALL_DEADLINE_S
        await _ready(plugin_node, agent)
        claim = plugin_node.allocate("throttled-once", ["npu-1"])
        _throttle(plugin_node, "throttled-once", times=1)
        answer = (await kubelet.prepare([claim])).claims[claim.uid]
        assert answer.error == ""
        assert [d.device_name for d in answer.devices] == ["npu-1"]


async def test_a_huge_claim_name_neither_breaks_the_answer_nor_floods_the_log(plugin_node):
    async with plugin_node.registered() as (agent, kubelet):
        await _ready(plugin_node, agent)
        good = plugin_node.allocate("good", ["npu-0"])
        huge = KubeletClaim(namespace="default", name="x" * (2 * 2**20), uid=good.uid[:-4] + "beef")
        answers = (await kubelet.prepare([good, huge])).claims
        assert answers[good.uid].error == ""
        error = answers[huge.uid].error
        assert "malformed name" in error
        assert len(error) < 2048
