"""npu-smi parsers and the Ascend error-code table, over captured and derived output."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.health import npu_faults, npusmi
from services.health.npusmi import ChipHealth, NpuChip
from services.health.observation import Fault
from shared.errors import BackendUnavailableError

FIXTURES = Path(__file__).parent / "fixtures"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (
            "npu-smi-info-910b3.txt",
            (
                NpuChip(npu=0, chip=0, name="910B3", health="OK", bus_id="0000:C1:00.0"),
                NpuChip(npu=1, chip=0, name="910B3", health="OK", bus_id="0000:C2:00.0"),
            ),
        ),
        (
            "npu-smi-info-310p3.txt",
            (NpuChip(npu=7, chip=0, name="310P3", health="OK", bus_id="0000:00:07.0"),),
        ),
        (
            "npu-smi-info-910b3-faults.txt",
            (
                NpuChip(npu=0, chip=0, name="910B3", health="OK", bus_id="0000:C1:00.0"),
                NpuChip(npu=1, chip=0, name="910B3", health="Alarm", bus_id="0000:C2:00.0"),
                NpuChip(npu=2, chip=0, name="910B3", health="Critical", bus_id="0000:81:00.0"),
                NpuChip(npu=3, chip=0, name="910B3", health="UNKNOWN", bus_id="0000:82:00.0"),
            ),
        ),
    ],
    ids=["8 x 910B3 sample", "310P3 sample with card id 7", "faults and a process table"],
)
def test_the_summary_table_gives_every_chip(name, expected):
    assert npusmi.parse_summary(fixture(name)) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "npu-smi: command not found\n",
        "| NPU   Name                | Health        |\n",
        "| NPU   Name | Health |\n| 0     910B3 | OK |\n",
        (
            "| NPU   Name | Health |\n| 0     910B3 | OK |\n"
            "| 1     910B3 | OK |\n| 0 | 0000:C2:00.0 |\n"
        ),
        "| NPU   Name | Health |\n| 0  | 0000:C1:00.0 |\n",
    ],
    ids=[
        "empty output",
        "an error message",
        "a header without devices",
        "an NPU row without its chip row at the end",
        "an NPU row without its chip row before the next NPU",
        "a chip row without an NPU row",
    ],
)
def test_malformed_summaries_raise_backend_unavailable(text):
    with pytest.raises(BackendUnavailableError):
        npusmi.parse_summary(text)


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
def test_malformed_chip_health_raises_backend_unavailable(text):
    with pytest.raises(BackendUnavailableError):
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
