"""The ascend monitor against a fake `npu-smi` (a real executable printing fixtures)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
from pathlib import Path

import pytest

from services.health.monitors.watchdog import Watchdog
from services.health.policy import UNMONITORED
from shared.backoff import Backoff
from shared.errors import BackendUnavailableError
from shared.vendors.ascend.monitor import AscendMonitor, device_names, run_command
from shared.vendors.ascend.npusmi import NpuChip, NpuSmiError
from shared.vendors.parts.observation import Observations

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


def _chip(npu: int, chip: int, **ids: int) -> NpuChip:
    return NpuChip(
        npu_id=npu, chip_id=chip, name="x", health="OK", bus_id="0000:01:00.0", memory_mb=1, **ids
    )


def test_chips_are_named_as_discovery_publishes_them():
    chips = [
        _chip(0, 0, phy_id=0),  # A3 dies: by physical id, not card and chip
        _chip(0, 1, phy_id=1),
        _chip(7, 0, logic_id=0),  # 310P: by the Device column, not the card id
        _chip(4, 0),  # 910B: by the NPU id
    ]
    assert [device_names([c])[(c.npu_id, c.chip_id)] for c in chips] == [
        "npu-0",
        "npu-1",
        "npu-0",
        "npu-4",
    ]


def test_two_chips_with_one_device_id_are_unreadable_output():
    with pytest.raises(NpuSmiError, match="two chips with device id 3"):
        device_names([_chip(3, 0), _chip(5, 0, logic_id=3)])


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
