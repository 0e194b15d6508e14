"""SIGTERM ends the allocation agent within its shutdown deadline while the disk is full and a
checkpoint write is stuck in the kernel.

Once in 19 tries under full-disk faults a SIGTERM seemed ignored for about 25 s: the agent had
stopped ("agent_stopped"), but the process waited at exit for a worker thread stuck in a
blocking write, which cancelling its awaiting task cannot interrupt. Here the checkpoint
directory is a full tmpfs and one write stalls for good: the claim's temporary file is a FIFO
nobody reads, so the agent's open() of it blocks in its worker thread as a write to a failing
disk would. The process must still exit 0 within its deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time

import pytest

from tests.reliability.disk_faults import DiskFull
from tests.reliability.harness import ReliabilityNode

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(120)]

SHUTDOWN_DEADLINE_S = 10.0
"""The allocation agent's own shutdown deadline (`services.allocation.cli`), well inside the
DaemonSet's terminationGracePeriodSeconds (30)."""


async def test_sigterm_ends_the_agent_in_time_with_a_write_stuck_on_a_full_disk(
    node: ReliabilityNode,
):
    fault = DiskFull(node.checkpoint_dir)
    fault.setup()
    agent = node.stack.agents["allocation"]
    assert agent.pid is not None
    claim = await node.allocated_claim(["npu-0"])
    stalled = node.checkpoint_dir / f".{claim.uid}.json.tmp-{agent.pid}"
    try:
        fault.apply()
        os.mkfifo(stalled)
        calls = asyncio.create_task(node.prepare([claim], timeout_s=5))
        await asyncio.sleep(1.5)  # the claim's GET and plan take milliseconds
        started = time.monotonic()
        code = await node.stack.stop_agent("allocation")
        elapsed = time.monotonic() - started
        calls.cancel()
        with contextlib.suppress(BaseException):
            await calls
        print(f"exit {code} {elapsed:.1f}s after SIGTERM")
        assert code == 0
        assert elapsed < SHUTDOWN_DEADLINE_S
        assert "blocking_calls_abandoned" in agent_log(node)
    finally:
        with contextlib.suppress(FileNotFoundError):
            stalled.unlink()
        fault.teardown()
    await node.stack.start_agent("allocation")
    await node.forget_kubelet()
    answer = (await node.prepare([claim]))[claim.uid]
    assert answer.error == ""


def agent_log(node: ReliabilityNode) -> str:
    return (node.stack.config.logs_dir / "allocation.log").read_text(errors="replace")
