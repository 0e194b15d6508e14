"""A claim's MPS daemon survives kill -9 of the agent (a real process): killed right after it
started the daemon, a restarted agent adopts it (never a second one) and finishes the claim;
killed right after unprepare removed the spec, the kubelet's retry stops it. The daemon is the
fake `nvidia-cuda-mps-control`; the inventory is the sim `gpu-shared` profile's."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from devcluster.kubelet import KubeletClaim, KubeletEmulator, KubeletError
from devcluster.processes import ChildProcess
from services.allocation.claim.checkpoint import ClaimState, PreparedMps
from services.allocation.mps.daemons import MpsDaemons
from tests.fakes import mps_control

pytestmark = pytest.mark.integration

DRIVER = "sim.dra-suite.io"
NODE = "node-a"
GPU = "GPU-9d11c4e2-e840-51ed-b15f-0be7ae073686"
LIMITS = "get_default_active_thread_percentage\nget_default_device_pinned_mem_limit 0\n"
CONFIG = {
    "apiVersion": f"{DRIVER}/v1alpha1",
    "kind": "DeviceConfig",
    "sharing": {
        "strategy": "SpacePartitioning",
        "spacePartitioning": {"computePercent": 30, "memoryLimit": "10Gi"},
    },
}


@pytest.fixture
def fake(plugin_node) -> Iterator[Path]:
    binary = mps_control.install(plugin_node.base / "bin")
    yield binary
    mps_control.kill_all(plugin_node.base)


@contextlib.asynccontextmanager
async def _running(plugin_node, process: ChildProcess) -> AsyncIterator[KubeletEmulator]:
    await process.start()
    kubelet = KubeletEmulator(plugin_node.config.plugin_registry_dir)
    try:
        await plugin_node.eventually(plugin_node.config.inventory_path.exists, timeout_s=20)
        await kubelet.register(driver=DRIVER, timeout_s=20)
        yield kubelet
    finally:
        await kubelet.close()
        await process.stop()


def _agent(plugin_node, fake: Path, crash_at: str = "") -> ChildProcess:
    process: ChildProcess = plugin_node.process(
        crash_at=crash_at, extra_args=["--mps-control-path", str(fake)]
    )
    return process


def _daemons(plugin_node, fake: Path) -> MpsDaemons:
    return MpsDaemons(plugin_node.config.mps_dir, binary=str(fake))


async def _prepare_ok(kubelet: KubeletEmulator, claim: KubeletClaim) -> None:
    assert (await kubelet.prepare([claim])).claims[claim.uid].error == ""


async def test_a_crash_after_the_daemon_started_adopts_it_and_unprepare_stops_it(plugin_node, fake):
    await plugin_node.publish_profile("gpu-shared")
    claim = plugin_node.allocate("shared", ["gpu-0"], parameters=CONFIG)
    crash = _agent(plugin_node, fake, crash_at="mps-started")
    async with _running(plugin_node, crash) as kubelet:
        with pytest.raises(KubeletError, match="NodePrepareResources"):
            await kubelet.prepare([claim])
        assert await crash.stop() in (137, 255), plugin_node.log()
    [pid] = mps_control.pids(plugin_node.base)
    record = plugin_node.stored().get(claim.uid)
    assert record.state is ClaimState.PREPARE_STARTED
    assert record.mps == PreparedMps(devices=(GPU,), thread_percentage=30, pinned_mib=(10240,))

    daemons = _daemons(plugin_node, fake)
    async with _running(plugin_node, _agent(plugin_node, fake)) as kubelet:
        await _prepare_ok(kubelet, claim)
        assert mps_control.pids(plugin_node.base) == [pid]
        assert mps_control.ask(str(fake), *daemons.directories(claim.uid), LIMITS) == (
            "30.0\n10240M"
        )
        assert plugin_node.stored().get(claim.uid).state is ClaimState.PREPARE_COMPLETED
    # A clean restart adopts it too.
    async with _running(plugin_node, _agent(plugin_node, fake)) as kubelet:
        assert mps_control.pids(plugin_node.base) == [pid]
        assert (await kubelet.unprepare([claim])).claims[claim.uid].error == ""
        assert mps_control.pids(plugin_node.base) == []
        assert daemons.claim_uids() == []
        assert plugin_node.checkpoint_files() == []


async def test_a_crash_during_unprepare_leaves_the_daemon_for_the_retry_to_stop(plugin_node, fake):
    await plugin_node.publish_profile("gpu-shared")
    claim = plugin_node.allocate("shared", ["gpu-0"], parameters=CONFIG)
    crash = _agent(plugin_node, fake, crash_at="unprepare-cdi-removed")
    async with _running(plugin_node, crash) as kubelet:
        await _prepare_ok(kubelet, claim)
        with pytest.raises(KubeletError, match="NodeUnprepareResources"):
            await kubelet.unprepare([claim])
        assert await crash.stop() in (137, 255), plugin_node.log()
    assert len(mps_control.pids(plugin_node.base)) == 1
    async with _running(plugin_node, _agent(plugin_node, fake)) as kubelet:
        assert len(mps_control.pids(plugin_node.base)) == 1  # adopted at start, not doubled
        assert (await kubelet.unprepare([claim])).claims[claim.uid].error == ""
        assert mps_control.pids(plugin_node.base) == []
        assert plugin_node.checkpoint_files() == []
