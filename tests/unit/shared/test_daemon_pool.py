"""DaemonThreadPool: blocking calls for asyncio whose stuck threads never hold the process."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time

import pytest

from shared.daemon_pool import DaemonThreadPool

STUCK_EXIT = """
import asyncio, threading, time
from shared.daemon_pool import DaemonThreadPool

async def main():
    loop = asyncio.get_running_loop()
    loop.set_default_executor(DaemonThreadPool(max_workers=2, thread_name_prefix="t"))
    stuck = asyncio.ensure_future(asyncio.to_thread(threading.Event().wait))
    await asyncio.sleep(0.1)
    stuck.cancel()

asyncio.run(main())
print("exited", flush=True)
"""


def _blocked(message: str) -> None:
    raise OSError(28, message)


async def test_results_and_errors_reach_the_caller():
    pool = DaemonThreadPool(max_workers=2, thread_name_prefix="test")
    loop = asyncio.get_running_loop()
    try:
        assert await loop.run_in_executor(pool, sum, [1, 2, 3]) == 6
        with pytest.raises(OSError, match="No space left"):
            await loop.run_in_executor(pool, _blocked, "No space left on device")
        results = await asyncio.gather(*(loop.run_in_executor(pool, abs, -i) for i in range(50)))
        assert results == list(range(50))
    finally:
        pool.shutdown()


def test_shutdown_gives_a_stuck_call_its_time_then_leaves_it():
    pool = DaemonThreadPool(max_workers=1, thread_name_prefix="test", exit_wait_s=0.2)
    release = threading.Event()
    stuck = pool.submit(release.wait)
    started = time.monotonic()
    pool.shutdown(wait=True)
    assert time.monotonic() - started < 1.0
    assert not stuck.done()
    with pytest.raises(RuntimeError, match="after shutdown"):
        pool.submit(abs, -1)
    release.set()
    assert stuck.result(timeout=2) is True


def test_a_process_exits_although_a_blocking_call_never_returns():
    """With asyncio's own executor this process waits for the stuck thread forever."""
    done = subprocess.run(
        [sys.executable, "-c", STUCK_EXIT], capture_output=True, text=True, timeout=20
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.endswith("exited\n")
