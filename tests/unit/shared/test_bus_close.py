"""Bus.close against a server that stopped answering: a bounded close, not nats-py's 10 s."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from devcluster.natsserver import NATSServerProcess
from shared.bus.connection import Bus
from shared.config import NATSSettings

pytestmark = pytest.mark.integration


async def test_closing_while_the_server_hangs_is_bounded_and_never_drains(
    nats_server_factory: Callable[[], NATSServerProcess],
) -> None:
    server = nats_server_factory()
    bus = Bus(NATSSettings(url=server.url), name="close-test")
    runner = asyncio.create_task(bus.run())
    try:
        await asyncio.wait_for(bus.connected.wait(), 10)
        await bus.subscribe("close.test", _ignore)
        # Every PING answered before the server stops: a late PONG of an earlier PING would
        # otherwise answer the close's probe (nats-py pairs PONGs with PINGs in order).
        await bus.nc.flush(timeout=5)
        pid = server._process.pid if server._process else 0
        os.kill(pid, signal.SIGSTOP)  # the socket stays open; no PONG ever comes
        await _stopped(pid)
        try:
            started = asyncio.get_running_loop().time()
            with capture_logs() as logs:
                await bus.close()
            took = asyncio.get_running_loop().time() - started
        finally:
            os.kill(pid, signal.SIGCONT)
        events = [entry["event"] for entry in logs]
        # The 1 s flush probe finds the server gone (`nats_drain_failed`) and closes, or the
        # client already saw the connection go and closes at once: either way no drain was
        # started and then cancelled.
        assert "nats_drain_timed_out" not in events
        assert set(events) <= {"nats_drain_failed"}
        assert took < 8  # nats-py's own drain would wait 10 s for its PONG
    finally:
        runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runner


def _thread_states(pid: int) -> list[str]:
    return [
        Path(task, "stat").read_text().rsplit(")", 1)[1].split()[0]
        for task in Path(f"/proc/{pid}/task").iterdir()
    ]


async def _stopped(pid: int) -> None:
    """Until every thread of `pid` is stopped: SIGSTOP reaches a running thread of a Go
    program a moment after kill() returns, time enough for it to answer one more PING."""
    for _ in range(500):
        if all(state in "Tt" for state in _thread_states(pid)):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"nats-server {pid} did not stop")


async def _ignore(_: object) -> None:
    return None
