"""MPS for shared GPUs against the fake `nvidia-cuda-mps-control`: the plan of a claim's
daemon (pure), and `MpsDaemons` starting, adopting, limiting and stopping it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from services.allocation.claim.checkpoint import PreparedMps
from services.allocation.claim.claims import DeviceResult
from services.allocation.claim.opaque import DeviceConfig, Strategy
from services.allocation.mps import limits
from services.allocation.mps.daemons import MpsDaemons
from shared.errors import ClaimError
from shared.pb.drasuite.v1 import inventory_pb2
from tests.fakes import mps_control

UID = "3c0f6a52-9a4e-4f7e-9d0b-6a1c2e3f4a5b"
SHARE = "0f5a9d1e-2b3c-4d5e-8f60-718293a4b5c6"
GPU = "GPU-9d11c4e2-e840-51ed-b15f-0be7ae073686"
MPS = PreparedMps(devices=(GPU,), thread_percentage=25, pinned_mib=(20480,))


def _gpu(name: str = "gpu-0", uuid: str = GPU) -> inventory_pb2.Device:
    return inventory_pb2.Device(name=name, kind="gpu", uuid=uuid, capacity={"memory": "80Gi"})


def _result(device: str = "gpu-0", *, share: str | None = SHARE, memory: str = "") -> DeviceResult:
    return DeviceResult(
        request="gpu",
        pool="node-a",
        device=device,
        share_id=share,
        consumed_capacity={"memory": memory} if memory else {},
    )


def test_a_share_gets_its_memory_as_the_pinned_limit_and_its_fraction_of_the_threads():
    assert limits.plan([(_result(memory="20Gi"), _gpu())], {}) == MPS


def test_two_shares_of_one_gpu_add_up_and_the_config_lowers_and_sets():
    resolved = [
        (_result(memory="10Gi"), _gpu()),
        (_result(share="11111111-2222-4333-8444-555555555555", memory="10Gi"), _gpu()),
    ]
    assert limits.plan(resolved, {}) == MPS
    config = DeviceConfig(
        strategy=Strategy.SPACE_PARTITIONING, compute_percent=40, memory_limit="8Gi"
    )
    assert limits.plan(resolved, {"gpu": config}) == PreparedMps(
        devices=(GPU,), thread_percentage=40, pinned_mib=(8192,)
    )


def test_whole_gpus_and_other_kinds_get_no_daemon_unless_space_partitioned():
    mig = inventory_pb2.Device(name="gpu-0-mig-1", kind="mig")
    assert limits.plan([(_result(share=None), _gpu()), (_result(), mig)], {}) is None
    config = DeviceConfig(strategy=Strategy.SPACE_PARTITIONING, compute_percent=50)
    planned = limits.plan([(_result(share=None), _gpu())], {"gpu": config})
    assert planned == PreparedMps(devices=(GPU,), thread_percentage=50, pinned_mib=(None,))


@pytest.fixture
def fake(short_tmp: Path) -> Iterator[Path]:
    binary = mps_control.install(short_tmp / "bin")
    yield binary
    mps_control.kill_all(short_tmp)


@pytest.fixture
def daemons(fake: Path, short_tmp: Path) -> MpsDaemons:
    return MpsDaemons(short_tmp / "mps", binary=str(fake), timeout_s=5)


def ask(daemons: MpsDaemons, uid: str, commands: str) -> str:
    return mps_control.ask(daemons.binary, *daemons.directories(uid), commands)


LIMITS = "get_default_active_thread_percentage\nget_default_device_pinned_mem_limit 0\n"


async def test_ensure_starts_one_daemon_with_the_claims_limits_and_adopts_it_after(
    daemons, short_tmp
):
    assert await daemons.ensure(UID, MPS) is True
    assert ask(daemons, UID, LIMITS) == "25.0\n20480M"
    [pid] = mps_control.pids(short_tmp)

    assert await daemons.ensure(UID, MPS) is False  # a restarted agent: adopted
    assert mps_control.pids(short_tmp) == [pid]
    assert daemons.claim_uids() == [UID]


async def test_stop_quits_the_daemon_and_removes_its_directories(daemons, short_tmp):
    await daemons.ensure(UID, MPS)
    assert await daemons.stop(UID) is True
    assert mps_control.pids(short_tmp) == []
    assert daemons.claim_uids() == []
    assert await daemons.stop(UID) is False


async def test_a_daemon_that_died_is_started_again(daemons, short_tmp):
    await daemons.ensure(UID, MPS)
    mps_control.kill_all(short_tmp)  # its socket stays behind, stale
    assert await daemons.ensure(UID, MPS) is True
    assert len(mps_control.pids(short_tmp)) == 1
    assert ask(daemons, UID, LIMITS) == "25.0\n20480M"


async def test_a_daemon_that_cannot_start_fails_the_claim_saying_why(daemons, fake):
    (fake.parent / "failures").write_text("start")
    with pytest.raises(ClaimError, match=r"start failed.*cannot initialise NVML"):
        await daemons.ensure(UID, MPS)


async def test_refused_limits_fail_the_claim_and_leave_no_daemon(daemons, fake, short_tmp):
    (fake.parent / "failures").write_text("commands")
    with pytest.raises(ClaimError, match="set limits failed"):
        await daemons.ensure(UID, MPS)
    assert mps_control.pids(short_tmp) == []
    assert daemons.claim_uids() == []


async def test_a_daemon_that_ignores_quit_fails_the_unprepare(daemons, fake):
    await daemons.ensure(UID, MPS)
    (fake.parent / "failures").write_text("quit")
    daemons.timeout_s = 0.3
    with pytest.raises(ClaimError, match="did not quit"):
        await daemons.stop(UID)


async def test_a_missing_binary_fails_the_claim(short_tmp):
    daemons = MpsDaemons(short_tmp / "mps", binary=str(short_tmp / "absent"), timeout_s=5)
    with pytest.raises(ClaimError, match=r"exit status 127.*cannot run"):
        await daemons.ensure(UID, MPS)
