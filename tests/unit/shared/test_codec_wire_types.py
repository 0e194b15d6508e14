"""codec refuses what protobuf alone reads as a message: other types' bytes, JSON non-objects."""

from __future__ import annotations

import pytest

from shared.bus import codec
from shared.errors import MalformedMessageError
from shared.pb.drasuite.v1 import alert_pb2, health_pb2, inventory_pb2

DRIVER = "sim.dra-suite.io"
RECORD = health_pb2.DeviceHealth(
    driver=DRIVER,
    node="node-a",
    pool="node-a",
    device="npu-0",
    state=health_pb2.HEALTH_STATE_HEALTHY,
    updated_unix_ms=5,
)
INVENTORY = inventory_pb2.Inventory(
    driver=DRIVER,
    node="node-a",
    pool="node-a",
    backend="sim",
    devices=[
        inventory_pb2.Device(name="npu-0", attributes={"a": inventory_pb2.AttributeValue(int=3)})
    ],
    generation=3,
)


def test_plain_protobuf_reads_a_health_record_as_an_empty_inventory_of_our_node():
    """Why the check exists: same field numbers, different wire types, no parse error."""
    parsed = inventory_pb2.Inventory.FromString(codec.encode(RECORD))
    assert (parsed.driver, parsed.node, len(parsed.devices)) == (DRIVER, "node-a", 0)


@pytest.mark.parametrize(
    ("cls", "data", "field"),
    [
        (inventory_pb2.Inventory, codec.encode(RECORD), "devices"),
        (health_pb2.DeviceHealth, codec.encode(INVENTORY), "state"),
        (health_pb2.FaultCommand, codec.encode(RECORD), "clear"),
        # A device whose `attributes` (a map of messages) arrives as a varint.
        (
            inventory_pb2.Inventory,
            bytes([0x2A, 5, 0x0A, 1, 0x78, 0x10, 0x05]),
            "devices.attributes",
        ),
    ],
    ids=["record-as-inventory", "inventory-as-record", "record-as-command", "nested"],
)
def test_a_known_field_with_another_wire_type_is_malformed(cls, data, field):
    with pytest.raises(MalformedMessageError, match=f"{field} has the wrong wire type"):
        codec.decode(cls, data, subject="key")


def test_unknown_field_numbers_from_newer_senders_still_decode():
    newer = codec.encode(INVENTORY) + bytes([0xF8, 0x01, 0x01])  # field 31, varint 1
    assert codec.decode(inventory_pb2.Inventory, newer, subject="key").generation == 3


def test_the_right_type_decodes():
    assert codec.decode(inventory_pb2.Inventory, codec.encode(INVENTORY), subject="k") == INVENTORY
    assert codec.decode(health_pb2.DeviceHealth, codec.encode(RECORD), subject="k") == RECORD


@pytest.mark.parametrize("data", [b"[]", b'"alert"', b"7", b"", b"[" * 5000, b"\xff"])
def test_json_that_is_no_object_is_no_alert(data):
    with pytest.raises(MalformedMessageError, match=r"not a drasuite\.v1\.Alert JSON document"):
        codec.decode_json(alert_pb2.Alert, data, subject="dra.alerts.x")
