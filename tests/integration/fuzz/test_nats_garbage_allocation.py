"""Malformed NATS messages on every KV key the allocation agent reads: the node's inventory and
its devices' health records.

Each bad value (random bytes, another message type, another driver, node or device, an empty
or an oversized value) must be logged and dropped: the last good inventory and health stay in
force, the agent keeps running and takes the next good value.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, MutableMapping
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from services.allocation.dra.agent import AllocationAgent
from services.allocation.node_view.health_board import Health
from shared.bus import codec, streams
from shared.errors import MalformedMessageError
from shared.pb.drasuite.v1 import alert_pb2, health_pb2, inventory_pb2
from tests.integration.allocation.conftest import DRIVER, NODE, PluginNode
from tests.integration.fuzz.fuzzing import Logs, fuzz_settings, garbage_bytes, until

pytestmark = pytest.mark.integration

OTHER = "other.example.com"
# A value that looks like a JetStream answer (`{"error":...`) is dropped one step earlier, by
# the Bus's KV watch, as a possibly redirected reply (`shared/bus/origin.py`).
INVENTORY_DROPPED = ("inventory_malformed", "kv_entry_dropped")
RECORD_DROPPED = ("health_record_malformed", "kv_entry_dropped")
# Below NATS's default max_payload (1 MiB) with room for the KV headers.
OVERSIZED = 1_000_000
# The largest value the health bucket takes (its max_msg_size, less room for headers).
OVERSIZED_RECORD = streams.limits_of("dra_health").max_msg_size - 512
STATES = {
    Health.HEALTHY: health_pb2.HEALTH_STATE_HEALTHY,
    Health.UNHEALTHY: health_pb2.HEALTH_STATE_UNHEALTHY,
}


def _record(device: str = "npu-0", **fields: Any) -> health_pb2.DeviceHealth:
    values: dict[str, Any] = {"driver": DRIVER, "node": NODE, "pool": NODE, "device": device}
    return health_pb2.DeviceHealth(**{**values, "state": 1, **fields})


def _inventory(**fields: Any) -> inventory_pb2.Inventory:
    values: dict[str, Any] = {"driver": DRIVER, "node": NODE, "pool": NODE, "backend": "sim"}
    return inventory_pb2.Inventory(**{**values, **fields})


def _oversized_noise(size: int = OVERSIZED) -> bytes:
    return b"\xff" + os.urandom(size)  # 0xff: field 31 with wire type 7, never valid


SHARED_GARBAGE = [
    ("random bytes", b"\xff\xfe\x00garbage" + bytes(range(256))),
    ("empty value", b""),
    ("alert as JSON", codec.encode_json(alert_pb2.Alert(id="a-1", driver=DRIVER, node=NODE))),
    ("fault command", codec.encode(health_pb2.FaultCommand(device="npu-0", clear=True))),
]
INVENTORY_GARBAGE = [
    *SHARED_GARBAGE,
    ("oversized noise", _oversized_noise()),
    ("health record", codec.encode(_record())),
    ("other driver", codec.encode(_inventory(driver=OTHER, devices=[{"name": "x-0"}]))),
    ("other node", codec.encode(_inventory(node="node-b", devices=[{"name": "x-0"}]))),
    (
        "oversized inventory of another node",
        codec.encode(_inventory(node="node-b", devices=[{"name": "n" * OVERSIZED}])),
    ),
]
RECORD_GARBAGE = [
    *SHARED_GARBAGE,
    ("oversized noise", _oversized_noise(OVERSIZED_RECORD)),
    ("inventory", codec.encode(_inventory(devices=[{"name": "npu-0"}]))),
    ("other driver", codec.encode(_record(driver=OTHER))),
    ("other node", codec.encode(_record(node="node-b"))),
    ("other device", codec.encode(_record(device="npu-1", state=2))),
    ("oversized record of another node", codec.encode(_record(node="n" * OVERSIZED_RECORD))),
]


class Node:
    """The running agent and the keys it reads, with good values that alternate."""

    def __init__(self, node: PluginNode, agent: AllocationAgent) -> None:
        self.node = node
        self.agent = agent
        self.bus = node.bus
        self.inventories = [("npu-0", "npu-1"), ("npu-0", "npu-1", "npu-2")]
        self.health = [Health.HEALTHY, Health.UNHEALTHY]

    def devices(self) -> tuple[str, ...]:
        current = self.agent.inventory.current
        return tuple(d.name for d in current.devices) if current is not None else ()

    def health_of(self, device: str) -> Health:
        return {view.device: view.health for view in self.agent.board.snapshot()}[device]

    async def put_inventory(self, data: bytes) -> None:
        key = self.bus.names.inventory_key(DRIVER, NODE)
        await self.bus.kv_put(self.bus.names.inventory_bucket, key, data)

    async def put_record(self, data: bytes, device: str = "npu-0") -> None:
        key = self.bus.names.health_key(DRIVER, NODE, device)
        await self.bus.kv_put(self.bus.names.health_bucket, key, data)

    async def next_inventory(self) -> None:
        """The other good inventory, once the agent serves it."""
        self.inventories.reverse()
        names = self.inventories[0]
        await self.node.publish_inventory(*names)
        await until(lambda: self.devices() == names, what=f"inventory {names} served")

    async def next_health(self) -> None:
        """The other good health of npu-0, once the agent shows it."""
        self.health.reverse()
        health = self.health[0]
        await self.node.publish_health("npu-0", STATES[health])
        await until(lambda: self.health_of("npu-0") is health, what=f"npu-0 {health}")


@pytest.fixture
async def node(plugin_node: PluginNode) -> AsyncIterator[Node]:
    async with plugin_node.agent() as agent:
        running = Node(plugin_node, agent)
        await running.next_inventory()
        await running.next_health()
        yield running


def _assert_names(event: MutableMapping[str, Any], key: str, label: str) -> None:
    """The drop's log line names the key and why."""
    if event["event"] == "kv_entry_dropped":
        assert event["subject"].endswith(f".{key}"), label
        assert event["reason"], label
        assert event["security"] is True, label
    else:
        assert event["key"] == key, label
        assert event["error"], label


async def _dropped_inventory(node: Node, logs: Logs, label: str, data: bytes) -> None:
    before, mark = node.devices(), logs.mark()
    await node.put_inventory(data)
    event = await logs.next(mark, *INVENTORY_DROPPED)
    _assert_names(event, node.bus.names.inventory_key(DRIVER, NODE), label)
    assert node.devices() == before, f"{label}: the inventory changed"
    await node.next_inventory()


async def _dropped_record(node: Node, logs: Logs, label: str, data: bytes) -> None:
    before, mark = node.health_of("npu-0"), logs.mark()
    await node.put_record(data)
    event = await logs.next(mark, *RECORD_DROPPED)
    _assert_names(event, node.bus.names.health_key(DRIVER, NODE, "npu-0"), label)
    assert node.health_of("npu-0") is before, f"{label}: the health of npu-0 changed"
    await node.next_health()


async def test_bad_inventories_are_logged_and_dropped(node: Node, logs: Logs):
    for label, data in INVENTORY_GARBAGE:
        await _dropped_inventory(node, logs, label, data)


async def test_bad_health_records_are_logged_and_dropped(node: Node, logs: Logs):
    for label, data in RECORD_GARBAGE:
        await _dropped_record(node, logs, label, data)


def _accepted(cls: type[inventory_pb2.Inventory | health_pb2.DeviceHealth], data: bytes) -> bool:
    """Whether `data` is, by chance, a good value for the key (then it is no garbage)."""
    try:
        message = codec.decode(cls, data, subject="fuzz")
    except MalformedMessageError:
        return False
    return (message.driver, message.node) == (DRIVER, NODE)


@fuzz_settings(max_examples=60)
@given(data=garbage_bytes(max_size=2048), key=st.sampled_from(["inventory", "health"]))
async def test_random_values_are_logged_and_dropped(node: Node, logs: Logs, data: bytes, key: str):
    if key == "inventory":
        assume(not _accepted(inventory_pb2.Inventory, data))
        await _dropped_inventory(node, logs, repr(data[:32]), data)
    else:
        assume(not _accepted(health_pb2.DeviceHealth, data))
        await _dropped_record(node, logs, repr(data[:32]), data)
