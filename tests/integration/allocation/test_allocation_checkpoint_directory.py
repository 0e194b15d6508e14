"""`<plugin data>/checkpoint` deleted under a running agent: the kubelet's next calls put the
records back, and `/healthz` fails while the directory cannot be used."""

from __future__ import annotations

import shutil
import socket

import aiohttp
import pytest

from shared.config import OpsSettings

pytestmark = pytest.mark.integration


def _ops() -> OpsSettings:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return OpsSettings(ops_host="127.0.0.1", ops_port=port)


async def _healthz(ops: OpsSettings) -> tuple[int, str]:
    url = f"http://{ops.ops_host}:{ops.ops_port}/healthz"
    async with aiohttp.ClientSession() as http, http.get(url) as response:
        return response.status, await response.text()


async def test_a_deleted_checkpoint_directory_is_restored_and_an_unusable_one_reported(
    plugin_node,
):
    ops = _ops()
    async with plugin_node.registered(ops=ops) as (agent, kubelet):
        await plugin_node.publish_inventory("npu-0", "npu-1")
        await plugin_node.eventually(lambda: agent.inventory.current is not None)
        first = plugin_node.allocate("first", ["npu-0"])
        answer = (await kubelet.prepare([first])).claims[first.uid]
        directory = plugin_node.config.checkpoint_dir

        shutil.rmtree(directory)
        assert (await kubelet.prepare([first])).claims[first.uid] == answer
        new = plugin_node.allocate("new", ["npu-1"])
        assert (await kubelet.prepare([new])).claims[new.uid].error == ""
        assert plugin_node.checkpoint_files() == sorted([f"{first.uid}.json", f"{new.uid}.json"])
        assert await _healthz(ops) == (200, "ok\n")

        saved = directory.with_name("checkpoint.saved")
        directory.rename(saved)
        directory.write_text("not a directory\n")
        status, text = await _healthz(ops)
        assert status == 503
        assert "checkpoint" in text
        directory.unlink()
        saved.rename(directory)
        assert await _healthz(ops) == (200, "ok\n")
        unprepared = await kubelet.unprepare([first, new])
        assert [a.error for a in unprepared.claims.values()] == ["", ""]
