"""Policy settings the agent takes from flags and the policy file, end to end.

Unknown Ascend error codes (`--ascend-unknown-codes`, the file's `ascend_unknown_codes`) with
a fake `npu-smi` printing captured output; extra ignored XIDs (`--additional-xids-to-ignore`)
with the fake NVML library.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from tests.fakes.nvml_events import FakeNVMLEvents

pytestmark = pytest.mark.integration

FIXTURES = Path(__file__).parents[2] / "unit" / "health" / "fixtures"
DRIVER = "sim.dra-suite.io"


def npu_smi_with_an_unknown_code(tmp_path: Path) -> str:
    """npu-0 OK; npu-1 in Alarm with error code 8FFF0001 (in no table); npu-2 not handled."""
    script = tmp_path / "npu-smi"
    health = {"1": "npu-smi-health-unknown-code.txt", "2": "npu-smi-health-nothandle.txt"}
    cases = "".join(
        f"  {card}) cat {shlex.quote(str(FIXTURES / name))} ;;\n" for card, name in health.items()
    )
    summary = FIXTURES / "npu-smi-info-910b3-faults.txt"
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$#" -eq 1 ]; then cat {shlex.quote(str(summary))}; exit 0; fi\n'
        f'case "$5" in\n{cases}  *) exit 3 ;;\nesac\n'
    )
    script.chmod(0o755)
    return str(script)


@pytest.mark.parametrize(
    ("flag", "document", "isolated"),
    [
        ("isolate", "", True),
        ("ignore", "", False),
        ("isolate", "ascend_unknown_codes: ignore\n", False),
        ("ignore", "ascend_unknown_codes: isolate\n", True),
    ],
    ids=[
        "the flag isolates",
        "the flag ignores",
        "the policy file ignores over the flag",
        "the policy file isolates over the flag",
    ],
)
async def test_unknown_ascend_codes_follow_the_flag_unless_the_policy_file_says(
    health, tmp_path: Path, flag: str, document: str, isolated: bool
):
    health.create_node()
    policy = tmp_path / "policy.yaml"
    policy.write_text(document)
    config = health.config(
        monitor="ascend",
        npu_smi_path=npu_smi_with_an_unknown_code(tmp_path),
        ascend_poll_s=0.1,
        ascend_unknown_codes=flag,
        policy_file=str(policy),
    )
    async with health.running(config) as agent:
        assert agent.rules.ascend_unknown_codes == ("isolate" if isolated else "ignore")
        await health.eventually(health.state_is("npu-0", health.HEALTHY))
        await health.eventually(health.state_is("npu-2", health.HEALTHY))
        expected = health.UNHEALTHY if isolated else health.HEALTHY
        found = await health.eventually(health.state_is("npu-1", expected))
        assert (found.cause, found.code) == (("npu", "8FFF0001") if isolated else ("", ""))


async def test_additional_xids_to_ignore_join_the_policys_ignore_list(health, tmp_path: Path):
    health.create_node()
    policy = tmp_path / "policy.yaml"
    policy.write_text("ignore:\n  xid: [999]\n")  # replaces the application XIDs
    fake = FakeNVMLEvents(count=3)
    config = health.config(
        monitor="nvml",
        nvml_event_timeout_ms=50,
        policy_file=str(policy),
        additional_xids_to_ignore=("79", "048"),
    )
    async with health.running(config, nvml_library=fake):
        for device in ("gpu-0", "gpu-1", "gpu-2"):
            await health.eventually(health.state_is(device, health.HEALTHY))
        fake.xid(0, 79)
        fake.xid(0, 48)
        fake.xid(0, 999)
        fake.xid(1, 13)  # no longer ignored: the file replaced the list
        found = await health.eventually(health.state_is("gpu-1", health.UNHEALTHY))
        assert (found.cause, found.code) == ("xid", "13")
        assert (await health.record("gpu-0")).state == health.HEALTHY
        fake.xid(0, 94)  # a fault after the ignored ones: they were all seen by then
        found = await health.eventually(health.state_is("gpu-0", health.UNHEALTHY))
        assert (found.cause, found.code) == ("xid", "94")
