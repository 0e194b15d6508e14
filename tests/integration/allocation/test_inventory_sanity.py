"""Inventory sanity through the real KV: an empty inventory and one whose generation goes
backwards are quarantined by the running allocation agent, which keeps preparing from the last
good inventory and logs each one."""

from __future__ import annotations

import pytest
import structlog

from shared.bus import codec
from shared.pb.drasuite.v1 import inventory_pb2
from tests.integration.allocation.conftest import DRIVER, NODE

pytestmark = pytest.mark.integration


async def test_empty_and_older_inventories_are_quarantined_and_the_last_good_one_serves(
    plugin_node,
):
    async with plugin_node.registered() as (agent, kubelet):
        good = await plugin_node.publish_inventory("npu-0", "npu-1")
        good = await plugin_node.publish_inventory("npu-0", "npu-1", "npu-2")
        await plugin_node.eventually(lambda: agent.inventory.current == good)
        key = plugin_node.bus.names.inventory_key(DRIVER, NODE)
        bucket = plugin_node.bus.names.inventory_bucket
        empty = inventory_pb2.Inventory(
            driver=DRIVER, node=NODE, pool=NODE, backend="sim", generation=good.generation + 1
        )
        older = inventory_pb2.Inventory()
        older.CopyFrom(good)
        del older.devices[1:]
        older.generation = good.generation - 1
        with structlog.testing.capture_logs() as events:
            for bad in (empty, older):
                await plugin_node.bus.kv_put(bucket, key, codec.encode(bad))
            await plugin_node.eventually(
                lambda: len([e for e in events if e["event"] == "inventory_quarantined"]) == 2
            )
        assert [e["reason"] for e in events if e["event"] == "inventory_quarantined"] == [
            "empty",
            "generation_backwards",
        ]
        assert agent.inventory.current == good
        claim = plugin_node.allocate("train", ["npu-2"])
        assert (await kubelet.prepare([claim])).claims[claim.uid].error == ""
