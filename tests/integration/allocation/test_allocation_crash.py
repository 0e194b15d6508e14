"""Crash safety with real processes: the agent dies (exit 137 / SIGKILL) at each step of a
prepare or unprepare, is started again, and the kubelet's retry must get the same answer.

The agent runs as `python -m services.allocation`; `DRA_SUITE_CRASH_AT` (the fault-injection
seam read by `cli`) makes it `os._exit(137)` at an exact step. After the restart: the same CDI
IDs, exactly one CDI spec per prepared claim and none after unprepare, no temporary files, and
a checkpoint that a fresh agent reads back as PrepareCompleted.
"""

from __future__ import annotations

import asyncio

import pytest

from devcluster.kubelet import KubeletClaim, KubeletEmulator, KubeletError
from services.allocation.cdi import spec_files
from services.allocation.claim.checkpoint import ClaimState
from services.allocation.config import CRASH_STEPS
from tests.integration.allocation.crash_harness import assert_crashed as _assert_crashed
from tests.integration.allocation.crash_harness import running as _running

pytestmark = pytest.mark.integration

DRIVER = "sim.dra-suite.io"
# `partition-created` is only reached by claims that ask for partitions: its own case below;
# `mps-started` by claims that share a GPU (test_mps_crash.py); `vfio-*` by claims for a VM
# (test_vfio_passthrough.py).
PREPARE_STEPS = [
    step
    for step in CRASH_STEPS
    if not step.startswith("unprepare")
    and "partition" not in step
    and step != "mps-started"
    and not step.startswith("vfio")
]
PARTITION_CONFIG = {
    "apiVersion": f"{DRIVER}/v1alpha1",
    "kind": "DeviceConfig",
    "partition": {"profile": "vir05_1c_8g"},
}


def _expected_ids(claim: KubeletClaim, devices: list[str]) -> list[list[str]]:
    return [
        [spec_files.device_id(DRIVER, spec_files.device_name(claim.uid, device))]
        for device in devices
    ]


def _assert_prepared_once(plugin_node, claims: list[KubeletClaim]) -> None:
    """One spec per claim and one completed record per claim; nothing else on disk."""
    assert plugin_node.cdi_files() == sorted(
        spec_files.spec_file_name(DRIVER, c.uid) for c in claims
    )
    assert plugin_node.checkpoint_files() == sorted(f"{c.uid}.json" for c in claims)
    stored = plugin_node.stored()
    assert {r.uid: r.state for r in stored.records()} == {
        c.uid: ClaimState.PREPARE_COMPLETED for c in claims
    }


async def _prepared(kubelet: KubeletEmulator, claim: KubeletClaim) -> list[list[str]]:
    answer = (await kubelet.prepare([claim])).claims[claim.uid]
    assert answer.error == ""
    return [list(device.cdi_device_ids) for device in answer.devices]


@pytest.mark.parametrize("step", PREPARE_STEPS, ids=PREPARE_STEPS)
async def test_a_crash_at_each_prepare_step_is_finished_by_the_kubelets_retry(plugin_node, step):
    await plugin_node.publish_inventory("npu-0", "npu-1", "npu-2")
    claim = plugin_node.allocate("train", ["npu-0", "npu-2"])
    async with _running(plugin_node, plugin_node.process(crash_at=step)) as (process, kubelet):
        with pytest.raises(KubeletError, match="NodePrepareResources"):
            await kubelet.prepare([claim])
        await _assert_crashed(plugin_node, process, step)
    async with _running(plugin_node, plugin_node.process()) as (_, kubelet):
        assert await _prepared(kubelet, claim) == _expected_ids(claim, ["npu-0", "npu-2"])
        _assert_prepared_once(plugin_node, [claim])
        assert await _prepared(kubelet, claim) == _expected_ids(claim, ["npu-0", "npu-2"])
        assert (await kubelet.unprepare([claim])).claims[claim.uid].error == ""
        assert plugin_node.cdi_files() == []
        assert plugin_node.checkpoint_files() == []


async def test_a_crash_during_unprepare_is_finished_by_the_kubelets_retry(plugin_node):
    await plugin_node.publish_inventory("npu-0", "npu-1")
    claim = plugin_node.allocate("train", ["npu-1"])
    process = plugin_node.process(crash_at="unprepare-cdi-removed")
    async with _running(plugin_node, process) as (process, kubelet):
        assert await _prepared(kubelet, claim) == _expected_ids(claim, ["npu-1"])
        with pytest.raises(KubeletError, match="NodeUnprepareResources"):
            await kubelet.unprepare([claim])
        await _assert_crashed(plugin_node, process, "unprepare-cdi-removed")
    # The spec is gone, the record not yet: the restart must not bring the spec back.
    assert plugin_node.cdi_files() == []
    assert plugin_node.checkpoint_files() == [f"{claim.uid}.json"]
    plugin_node.api.delete_object("resourceclaims", claim.name, "default")
    async with _running(plugin_node, plugin_node.process()) as (_, kubelet):
        assert (await kubelet.unprepare([claim])).claims[claim.uid].error == ""
        assert plugin_node.cdi_files() == []
        assert plugin_node.checkpoint_files() == []


async def test_sigkill_in_the_middle_of_a_batch_leaves_nothing_half_done(plugin_node):
    devices = [f"npu-{i}" for i in range(8)]
    await plugin_node.publish_inventory(*devices)
    claims = [plugin_node.allocate(f"c{i}", [devices[i % 8]]) for i in range(24)]
    async with _running(plugin_node, plugin_node.process()) as (process, kubelet):
        calls = [asyncio.create_task(kubelet.prepare([claim])) for claim in claims]
        await asyncio.sleep(0.05)
        await process.kill()
        await asyncio.gather(*calls, return_exceptions=True)
    async with _running(plugin_node, plugin_node.process()) as (_, kubelet):
        answers = await asyncio.gather(*(_prepared(kubelet, claim) for claim in claims))
        assert answers == [_expected_ids(c, [devices[i % 8]]) for i, c in enumerate(claims)]
        _assert_prepared_once(plugin_node, claims)
        assert not [p for p in plugin_node.config.cdi_root.iterdir() if ".tmp-" in p.name]


async def test_a_truncated_checkpoint_is_quarantined_and_the_claim_prepared_again(plugin_node):
    await plugin_node.publish_inventory("npu-0", "npu-1")
    claim = plugin_node.allocate("train", ["npu-1"])
    async with _running(plugin_node, plugin_node.process()) as (process, kubelet):
        before = await _prepared(kubelet, claim)
        await process.kill()
    record = plugin_node.config.checkpoint_dir / f"{claim.uid}.json"
    record.write_bytes(record.read_bytes()[:40])
    async with _running(plugin_node, plugin_node.process()) as (_, kubelet):
        # Without a readable record the spec is an orphan; the retry rebuilds both.
        assert f"{claim.uid}.json.corrupt" in plugin_node.checkpoint_files()
        assert await _prepared(kubelet, claim) == before
        assert plugin_node.spec(claim.uid) is not None
        assert plugin_node.stored().get(claim.uid) is not None


async def test_a_crash_after_a_partition_was_made_neither_leaks_nor_duplicates_it(plugin_node):
    await plugin_node.publish_inventory("npu-0", "npu-1", "npu-2")
    claim = plugin_node.allocate("vnpu", ["npu-0", "npu-2"], parameters=PARTITION_CONFIG)
    crash = plugin_node.process(crash_at="partition-created")
    async with _running(plugin_node, crash) as (process, kubelet):
        with pytest.raises(KubeletError, match="NodePrepareResources"):
            await kubelet.prepare([claim])
        await _assert_crashed(plugin_node, process, "partition-created")
    # Died right after the first partition: it is on record, the claim PrepareStarted.
    [first] = plugin_node.partitions()
    assert (first["claimUID"], first["device"]) == (claim.uid, "npu-0")
    assert plugin_node.stored().get(claim.uid).state is ClaimState.PREPARE_STARTED
    async with _running(plugin_node, plugin_node.process()) as (_, kubelet):
        assert await _prepared(kubelet, claim) == _expected_ids(claim, ["npu-0", "npu-2"])
        made = plugin_node.partitions()
        assert [(p["claimUID"], p["device"]) for p in made] == [
            (claim.uid, "npu-0"),
            (claim.uid, "npu-2"),
        ]
        assert made[0]["id"] == first["id"]
        _assert_prepared_once(plugin_node, [claim])
        spec = plugin_node.spec(claim.uid)
        assert spec is not None
        ids = ",".join(p["id"] for p in made)
        for device, partition in zip(spec["devices"], made, strict=True):
            # Variables are per request (joined over its devices); nodes are per device.
            env = device["containerEdits"]["env"]
            assert f"DRA_SUITE_PARTITION_ID={ids}" in env
            assert f"ASCEND_VISIBLE_DEVICES={ids}" in env
            assert "DRA_SUITE_PARTITION_PROFILE=vir05_1c_8g" in env
            assert device["containerEdits"]["deviceNodes"] == [
                {"path": f"/dev/davinci{partition['id']}", "hostPath": "/dev/null"}
            ]
        assert await _prepared(kubelet, claim) == _expected_ids(claim, ["npu-0", "npu-2"])
        assert plugin_node.partitions() == made
        assert (await kubelet.unprepare([claim])).claims[claim.uid].error == ""
        assert plugin_node.partitions() == []
        assert plugin_node.cdi_files() == []
        assert plugin_node.checkpoint_files() == []
