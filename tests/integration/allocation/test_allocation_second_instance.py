"""A second agent started on the node without `--rolling-update-uid` has the live agent's socket
paths: it must fail to start and leave the live agent's sockets (and checkpoint) alone."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from services.allocation.dra.agent import AllocationAgent
from shared.supervisor import run_agent

pytestmark = pytest.mark.integration


async def test_a_second_instance_fails_and_the_live_one_keeps_serving(plugin_node):
    async with plugin_node.registered() as (agent, kubelet):
        await plugin_node.publish_inventory("npu-0", "npu-1")
        await plugin_node.eventually(lambda: agent.inventory.current is not None)
        first = plugin_node.allocate("first", ["npu-0"])
        assert (await kubelet.prepare([first])).claims[first.uid].error == ""
        config = plugin_node.config
        sockets = [config.dra_socket_path, config.registration_socket_path]
        identities = [path.stat().st_ino for path in sockets]

        second = AllocationAgent(dataclasses.replace(config))
        code = await asyncio.wait_for(
            run_agent(second, grace_s=5, stop=asyncio.Event(), handle_signals=False), 10
        )
        assert code != 0
        assert [path.stat().st_ino for path in sockets] == identities
        assert all(path.is_socket() for path in sockets)
        again = plugin_node.allocate("after", ["npu-1"])
        assert (await kubelet.prepare([again])).claims[again.uid].error == ""
        assert plugin_node.spec(first.uid) is not None
