"""The hang report: a stuck asyncio test shows each task's stack before pytest-timeout ends it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

_STUCK_TEST = """
import asyncio

import pytest


async def wait_for_nothing() -> None:
    await asyncio.Event().wait()


@pytest.mark.timeout(4)
async def test_stuck() -> None:
    helper = asyncio.create_task(wait_for_nothing(), name="helper-task")
    await helper
"""


def test_a_stuck_asyncio_test_reports_every_task_stack(tmp_path: Path) -> None:
    (tmp_path / "test_stuck.py").write_text(_STUCK_TEST)
    (tmp_path / "pytest.ini").write_text("[pytest]\nasyncio_mode = auto\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.hang_report", "-q", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "Timeout (>4.0s)" in output
    assert "test_stuck.py::test_stuck: no progress; the stack of every asyncio task" in output
    assert "name='helper-task'" in output
    assert "in wait_for_nothing" in output
    assert "in test_stuck" in output
