"""Options made on demand survive kill -9: the agent (a real process) dies right after making
the first of a claim's two MIG partitions; the kubelet's retry on a restarted agent makes only
the second, at its own placement, and unprepare removes both.

The inventory is what the discovery agent publishes for the sim `gpu-mig` profile.
"""

from __future__ import annotations

import pytest

from devcluster.kubelet import KubeletClaim, KubeletEmulator, KubeletError
from services.allocation.cdi import spec_files
from services.allocation.claim.checkpoint import ClaimState
from tests.integration.allocation.crash_harness import running as _running

pytestmark = pytest.mark.integration

DRIVER = "sim.dra-suite.io"
NODE = "node-a"
OPTIONS = ["gpu-0-mig-1g10gb-19-0", "gpu-0-mig-1g10gb-19-4"]


async def _prepared(kubelet: KubeletEmulator, claim: KubeletClaim) -> list[list[str]]:
    answer = (await kubelet.prepare([claim])).claims[claim.uid]
    assert answer.error == ""
    return [list(device.cdi_device_ids) for device in answer.devices]


async def test_a_crash_after_the_first_on_demand_partition_neither_leaks_nor_duplicates_it(
    plugin_node,
):
    await plugin_node.publish_profile("gpu-mig")
    claim = plugin_node.allocate("mig", OPTIONS)
    crash = plugin_node.process(crash_at="partition-created")
    async with _running(plugin_node, crash) as (process, kubelet):
        with pytest.raises(KubeletError, match="NodePrepareResources"):
            await kubelet.prepare([claim])
        assert await process.stop() in (137, 255), plugin_node.log()
    [first] = plugin_node.partitions()
    assert (first["claimUID"], first["device"], first["placement"]) == (claim.uid, "gpu-0", 0)
    assert plugin_node.stored().get(claim.uid).state is ClaimState.PREPARE_STARTED

    expected = [
        [spec_files.device_id(DRIVER, spec_files.device_name(claim.uid, d))] for d in OPTIONS
    ]
    async with _running(plugin_node, plugin_node.process()) as (_, kubelet):
        assert await _prepared(kubelet, claim) == expected
        made = plugin_node.partitions()
        assert [(p["device"], p["profile"], p["placement"]) for p in made] == [
            ("gpu-0", "1g.10gb", 0),
            ("gpu-0", "1g.10gb", 4),
        ]
        assert made[0]["id"] == first["id"]
        spec = plugin_node.spec(claim.uid)
        assert spec is not None
        ids = ",".join(p["id"] for p in made)
        for device, partition in zip(spec["devices"], made, strict=True):
            assert f"NVIDIA_VISIBLE_DEVICES={ids}" in device["containerEdits"]["env"]
            nodes = [(n["path"], n["hostPath"]) for n in device["containerEdits"]["deviceNodes"]]
            assert nodes == [tuple(node) for node in partition["deviceNodes"]]
        assert plugin_node.stored().get(claim.uid).state is ClaimState.PREPARE_COMPLETED
        assert await _prepared(kubelet, claim) == expected
        assert plugin_node.partitions() == made
        assert (await kubelet.unprepare([claim])).claims[claim.uid].error == ""
        assert plugin_node.partitions() == []
        assert plugin_node.cdi_files() == []
        assert plugin_node.checkpoint_files() == []
