"""`dra-health` as a process: a policy file it cannot use is a one-line error and exit 2,
before it opens any connection (docs/operations.md, "Configuration"), never a traceback."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)


async def _run_health(*args: str) -> tuple[int | None, str]:
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "services.health", "--node-name", "node-a"),
        *("--nats-url", "nats://127.0.0.1:9"),  # never dialled: the policy is read first
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, stderr = await asyncio.wait_for(process.communicate(), 30)
    return process.returncode, stderr.decode()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "No such file or directory"),
        ("xid: [unclosed\n", "not YAML"),
        ("no_such_rule: 1\n", "unknown keys ['no_such_rule']"),
    ],
    ids=["missing", "not-yaml", "unknown-key"],
)
async def test_an_invalid_policy_file_is_one_line_and_exit_2(tmp_path: Path, content, message):
    policy = tmp_path / "policy.yaml"
    if content is not None:
        policy.write_text(content)
    code, stderr = await _run_health("--policy-file", str(policy))
    assert code == 2, stderr
    assert "Traceback" not in stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("dra-health: policy file"), stderr
    assert message in lines[0], stderr
