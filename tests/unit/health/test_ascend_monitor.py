"""The ascend monitor against a fake `npu-smi` (a real executable printing fixtures)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
from pathlib import Path

import pytest

from services.health.monitors.ascend import AscendMonitor, device_names, run_command
from services.health.monitors.watchdog import Watchdog
from services.health.npusmi import NpuChip
from services.health.observation import Observations
from services.health.policy import UNMONITORED
from shared.backoff import Backoff
from shared.errors import BackendUnavailableError

FIXTURES = Path(__file__).parent / "fixtures"


def fake_npu_smi(
    tmp_path: Path, *, summary: str, health: dict[str, str] | None = None, body: str = ""
) -> str:
    """An `npu-smi` that prints fixture `summary` for `info` and `health[card]` for `-t health`."""
    cases = "".join(
        f"  {card}) cat {shlex.quote(str(FIXTURES / name))} ;;\n"
        for card, name in (health or {}).items()
    )
    tmp_path.mkdir(parents=True, exist_ok=True)
    script = tmp_path / "npu-smi"
    script.write_text(
        "#!/bin/sh\n"
        f"{body}"
        'if [ "$#" -eq 1 ]; then\n'
        f"  cat {shlex.quote(str(FIXTURES / summary))}\n  exit 0\nfi\n"
        'case "$5" in\n'
        f"{cases}"
        "  *) echo unexpected card >&2; exit 3 ;;\nesac\n"
    )
    script.chmod(0o755)
    return str(script)


async def test_a_healthy_node_reports_every_chip_healthy(tmp_path):
    monitor = AscendMonitor(
        pool="node-a", npu_smi=fake_npu_smi(tmp_path, summary="npu-smi-info-910b3.txt")
    )
    view = await monitor.poll()
    assert view.pool == "node-a"
    assert [(o.device, o.fault, o.unknown) for o in view.devices] == [
        ("npu-0", None, False),
        ("npu-1", None, False),
    ]


async def test_unwell_chips_are_queried_for_their_error_codes(tmp_path):
    npu_smi = fake_npu_smi(
        tmp_path,
        summary="npu-smi-info-910b3-faults.txt",
        health={"1": "npu-smi-health-alarm.txt", "2": "npu-smi-health-restart.txt"},
    )
    view = await AscendMonitor(pool="node-a", npu_smi=npu_smi).poll()
    by_device = {o.device: o for o in view.devices}
    assert by_device["npu-0"].fault is None
    fault_1, fault_2 = by_device["npu-1"].fault, by_device["npu-2"].fault
    assert fault_1 is not None
    assert (fault_1.cause, fault_1.code) == ("npu", "80E18402")
    assert "heartbeat lost" in fault_1.message
    assert fault_2 is not None
    assert (fault_2.cause, fault_2.code) == ("npu-restart", "8C03A000")
    assert by_device["npu-3"].unknown


@pytest.mark.parametrize(
    ("isolate", "faulty"), [(True, True), (False, False)], ids=["isolate", "ignore"]
)
async def test_unknown_error_codes_isolate_unless_configured_otherwise(tmp_path, isolate, faulty):
    npu_smi = fake_npu_smi(
        tmp_path,
        summary="npu-smi-info-910b3-faults.txt",
        health={"1": "npu-smi-health-unknown-code.txt", "2": "npu-smi-health-nothandle.txt"},
    )
    view = await AscendMonitor(pool="n", npu_smi=npu_smi, isolate_unknown=isolate).poll()
    by_device = {o.device: o for o in view.devices}
    assert (by_device["npu-1"].fault is not None) is faulty
    assert by_device["npu-2"].fault is None


@pytest.mark.parametrize(
    ("summary", "body"),
    [
        ("npu-smi-health-ok.txt", ""),
        ("npu-smi-info-910b3.txt", "echo 'dcmi init failed' >&2; exit 255\n"),
        ("npu-smi-info-910b3.txt", "sleep 5\n"),
    ],
    ids=["malformed output", "non-zero exit", "hangs past the timeout"],
)
async def test_npu_smi_failures_raise_backend_unavailable(tmp_path, summary, body):
    npu_smi = fake_npu_smi(tmp_path, summary=summary, body=body)
    with pytest.raises(BackendUnavailableError):
        await AscendMonitor(pool="n", npu_smi=npu_smi, timeout_s=0.3).poll()


async def test_a_missing_binary_raises_backend_unavailable(tmp_path):
    with pytest.raises(BackendUnavailableError):
        await run_command([str(tmp_path / "no-such-npu-smi"), "info"], 1.0)


def test_multi_chip_cards_name_each_chip():
    chips = [
        NpuChip(npu=0, chip=0, name="A3", health="OK"),
        NpuChip(npu=0, chip=1, name="A3", health="OK"),
        NpuChip(npu=4, chip=0, name="910B3", health="OK"),
    ]
    assert device_names(chips) == {(0, 0): "npu-0-0", (0, 1): "npu-0-1", (4, 0): "npu-4"}


async def test_output_turning_malformed_makes_devices_unmonitored_and_the_monitor_goes_on(
    tmp_path,
):
    npu_smi = fake_npu_smi(tmp_path, summary="npu-smi-info-910b3.txt")
    monitor = AscendMonitor(pool="n", npu_smi=npu_smi, poll_s=0.05)
    watchdog = Watchdog(
        monitor, name="ascend", deadline_s=10, restart=Backoff(initial_s=0.05, max_s=0.05)
    )
    views: list[Observations] = []
    task = asyncio.create_task(watchdog.run(views.append))
    try:
        await _until(lambda: bool(views))
        assert not any(o.unknown for o in views[-1].devices)
        os.replace(_broken(tmp_path), npu_smi)
        await _until(lambda: not watchdog.monitored)
        last = views[-1]
        assert all(o.unknown for o in last.devices)
        assert all(o.fault is not None and o.fault.cause == UNMONITORED for o in last.devices)
        os.replace(fake_npu_smi(tmp_path / "ok", summary="npu-smi-info-910b3.txt"), npu_smi)
        await _until(lambda: watchdog.monitored)
        assert not any(o.unknown for o in views[-1].devices)
        assert watchdog.failures >= 1
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _broken(tmp_path: Path) -> str:
    return fake_npu_smi(tmp_path / "broken", summary="npu-smi-health-ok.txt")


async def _until(check, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)
