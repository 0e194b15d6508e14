"""The crash tests' harness: the allocation agent as a real process, registered with the
kubelet emulator, and the check that it died by the crash seam (`DRA_SUITE_CRASH_AT`)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from devcluster.kubelet import KubeletEmulator
from devcluster.processes import ChildProcess

DRIVER = "sim.dra-suite.io"


@contextlib.asynccontextmanager
async def running(
    plugin_node: Any, process: ChildProcess, *, driver: str = DRIVER
) -> AsyncIterator[tuple[ChildProcess, KubeletEmulator]]:
    """Start `process`, wait for its saved inventory and registration; stop it afterwards."""
    await process.start()
    kubelet = KubeletEmulator(plugin_node.config.plugin_registry_dir)
    try:
        await plugin_node.eventually(plugin_node.config.inventory_path.exists, timeout_s=20)
        await kubelet.register(driver=driver, timeout_s=20)
        yield process, kubelet
    finally:
        await kubelet.close()
        await process.stop()


async def assert_crashed(plugin_node: Any, process: ChildProcess, step: str) -> None:
    """The process died by the seam at `step`: exit 137 (255 when asyncio's child watcher lost
    the race to reap it and could not read the status; the log line still proves the step)."""
    code = await process.stop()
    assert code in (137, 255), plugin_node.log()
    assert any(
        "crash_injected" in line and f"step={step}" in line
        for line in plugin_node.log().splitlines()
    ), plugin_node.log()
