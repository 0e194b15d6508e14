"""The kubelet wipes the node's ResourceSlices (as it does when it starts, or when the plugin
deregisters): the discovery agent must publish them again within a second.

The wipe is the kubelet's own call, a DELETE collection with `fieldSelector=spec.nodeName`.
Timing is measured from the moment the DELETE returns to the moment a list shows every device
of the profile again; asserted as p50 <= 1 s and max <= 2 s over a few repetitions.
"""

from __future__ import annotations

import asyncio
import statistics
import time

import pytest

from tests.reliability.harness import NODE, ReliabilityNode, profile_devices

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(120)]

REPETITIONS = 5
P50_LIMIT_S = 1.0
MAX_LIMIT_S = 2.0


async def _recreated_after_wipe(node: ReliabilityNode) -> float:
    want = sorted(profile_devices(node.profile))
    wiped = await node.api.wipe_slices(NODE)
    assert wiped["items"], "the wipe deleted nothing: the slices were not there"
    started = time.monotonic()
    while await node.slice_devices() != want:
        if time.monotonic() - started > 10:
            raise AssertionError(f"slices not re-created within 10 s: {await node.slice_devices()}")
        await asyncio.sleep(0.01)
    return time.monotonic() - started


async def test_wiped_slices_are_recreated_within_a_second(node: ReliabilityNode):
    timings = []
    for _ in range(REPETITIONS):
        timings.append(await _recreated_after_wipe(node))
        await asyncio.sleep(0.2)
    figures = f"p50 {statistics.median(timings):.3f}s, max {max(timings):.3f}s, all {timings}"
    print(f"slice wipe -> re-created: {figures}")
    assert statistics.median(timings) <= P50_LIMIT_S, figures
    assert max(timings) <= MAX_LIMIT_S, figures
    # Re-created, not duplicated: the pool is exactly the profile, once.
    assert await node.slice_devices() == sorted(profile_devices(node.profile))
