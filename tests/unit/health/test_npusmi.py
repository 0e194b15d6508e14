"""The shared npu-smi parsers as the health monitor uses them, and the Ascend error-code table,
over captured and derived output."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.vendors.ascend import npu_faults, npusmi
from shared.vendors.ascend.npusmi import ChipHealth, NpuSmiError
from shared.vendors.parts.observation import Fault

FIXTURES = Path(__file__).parent / "fixtures"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def _chip(
    npu: int, health: str, bus: str, *, name: str = "910B3", **ids: int
) -> tuple[int, int, str, str, str, int]:
    return (npu, ids.get("chip", 0), name, health, bus, ids.get("device", npu))


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (
            "npu-smi-info-910b3.txt",
            [_chip(0, "OK", "0000:c1:00.0"), _chip(1, "OK", "0000:c2:00.0")],
        ),
        (
            "npu-smi-info-310p3.txt",
            [_chip(7, "OK", "0000:00:07.0", name="310P3", device=0)],
        ),
        (
            "npu-smi-info-910b3-faults.txt",
            [
                _chip(0, "OK", "0000:c1:00.0"),
                _chip(1, "Alarm", "0000:c2:00.0"),
                _chip(2, "Critical", "0000:81:00.0"),
                _chip(3, "UNKNOWN", "0000:82:00.0"),
            ],
        ),
    ],
    ids=["8 x 910B3 sample", "310P3 sample with card id 7", "faults and a process table"],
)
def test_the_shared_summary_parser_gives_every_chip_the_monitor_watches(name, expected):
    chips = npusmi.parse_info(fixture(name))
    found = [(c.npu_id, c.chip_id, c.name, c.health, c.bus_id, c.device_id) for c in chips]
    assert found == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "npu-smi: command not found\n",
        "| NPU   Name | Health |\n| Chip | Bus-Id |\n| 0     910B3 | OK | 1.0 |\n",
        (
            "| NPU   Name | Health |\n| Chip | Bus-Id |\n| 0     910B3 | OK | 1.0 |\n"
            "| 1     910B3 | OK | 1.0 |\n| 0 | 0000:C2:00.0 | 0 0 / 1 |\n"
        ),
        "| NPU   Name | Health |\n| Chip | Bus-Id |\n| 0  | 0000:C1:00.0 | 0 0 / 1 |\n",
    ],
    ids=[
        "empty output",
        "an error message",
        "an NPU row without its chip row at the end",
        "an NPU row without its chip row before the next NPU",
        "a chip row without an NPU row",
    ],
)
def test_malformed_summaries_raise_the_one_npu_smi_error(text):
    with pytest.raises(NpuSmiError):
        npusmi.parse_info(text)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (
            "npu-smi-health-alarm.txt",
            ChipHealth(
                status="Alarm",
                codes=("80E18402",),
                information="node type=SOC, sensor type=Heartbeat, event state=heartbeat lost",
            ),
        ),
        (
            "npu-smi-health-restart.txt",
            ChipHealth(status="Critical", codes=("81A3880C", "8C03A000")),
        ),
        ("npu-smi-health-ok.txt", ChipHealth(status="OK")),
    ],
    ids=["one code with information", "two codes", "no codes"],
)
def test_chip_health_gives_status_codes_and_information(name, expected):
    assert npusmi.parse_chip_health(fixture(name)) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "\tError Code : 80E18402\n",
        "\tHealth Status : Dying\n",
        "\tHealth Status : OK\n\tError Code : zz!\n",
    ],
    ids=["empty", "no health status", "unknown status", "malformed code"],
)
def test_malformed_chip_health_raises_the_one_npu_smi_error(text):
    with pytest.raises(NpuSmiError):
        npusmi.parse_chip_health(text)


@pytest.mark.parametrize(
    ("codes", "isolate", "cause", "code"),
    [
        ((), True, None, None),
        (("80E21007",), True, None, None),
        (("81A3880C",), True, "npu-subhealth", "81A3880C"),
        (("8C03A000",), True, "npu-restart", "8C03A000"),
        (("80C98008",), True, "npu-restart", "80C98008"),
        (("80E18402",), True, "npu", "80E18402"),
        (("8118043C",), True, "npu", "8118043C"),
        (("81A3880C", "8C03A000", "80E3A201"), True, "npu", "80E3A201"),
        (("8FFF0001",), True, "npu", "8FFF0001"),
        (("8FFF0001",), False, None, None),
        (("8FFF0001", "8C03A000"), False, "npu-restart", "8C03A000"),
    ],
    ids=[
        "no codes",
        "not-handle level is no fault",
        "sub-health level",
        "restart level",
        "restart request level",
        "separate level",
        "pre-separate level",
        "the most severe code decides",
        "an unknown code isolates by default",
        "an unknown code can be ignored",
        "an ignored unknown code leaves the known ones",
    ],
)
def test_error_codes_map_to_faults_by_level(codes, isolate, cause, code):
    fault = npu_faults.fault_for(codes, status="Alarm", isolate_unknown=isolate)
    if cause is None:
        assert fault is None
    else:
        assert isinstance(fault, Fault)
        assert (fault.cause, fault.code) == (cause, code)
        assert fault.message.startswith("npu-smi Alarm: ")
