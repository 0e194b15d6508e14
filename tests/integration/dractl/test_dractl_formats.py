"""dractl's answers in every output format, against a real nats-server: tables that show what
operators need (drain taints, AGE), wide columns only with -o wide, and JSON/YAML as one
document with human field names and RFC 3339 times."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from shared.bus import codec
from shared.bus.connection import Bus
from shared.config import NATSSettings
from tests.integration.dractl.dractl_process import (
    DRIVER,
    NODE,
    dractl,
    inventory,
    publish_alert,
    publish_node,
)

pytestmark = pytest.mark.integration


async def test_health_table_shows_the_drain_taint_and_an_age(bus: Bus, nats_settings: NATSSettings):
    await publish_node(bus)
    answer = await dractl(nats_settings, "health")
    assert answer.code == 0, answer.err
    header, row = answer.out.splitlines()
    assert header.split() == ["DEVICE", "STATE", "CAUSE", "CODE", "TAINTS", "AGE"]
    assert row.split()[:5] == ["gpu-0", "HEALTHY", "-", "-", f"{DRIVER}/drain=RMA-4711:NoSchedule"]
    assert row.split()[5].endswith("d")  # since 2025-11-22: days ago


async def test_wide_columns_appear_only_with_o_wide(bus: Bus, nats_settings: NATSSettings):
    await publish_node(bus)
    narrow = await dractl(nats_settings, "inventory")
    wide = await dractl(nats_settings, "inventory", "-o", "wide")
    assert narrow.out.splitlines()[0].split() == ["DEVICE", "KIND", "CAPACITY", "PUBLISHED"]
    assert wide.out.splitlines()[0].split() == [
        *("DEVICE", "KIND", "CAPACITY", "PUBLISHED"),
        *("POOL", "ATTRIBUTES", "UNPUBLISHED"),
    ]
    assert "numaNode=1" in wide.out
    assert "numaNode" not in narrow.out


async def test_health_json_is_one_list_with_human_names_and_rfc3339_times(
    bus: Bus, nats_settings: NATSSettings
):
    await publish_node(bus)
    answer = await dractl(nats_settings, "health", "-o", "json")
    assert answer.code == 0, answer.err
    [record] = json.loads(answer.out)  # one document: the whole output parses
    assert record["device"] == "gpu-0"
    assert record["state"] == "HEALTHY"
    assert record["since"] == "2025-11-22T02:53:20.123Z"
    assert record["taints"] == [
        {
            "key": f"{DRIVER}/drain",
            "value": "RMA-4711",
            "effect": "NoSchedule",
            "timeAdded": "2025-11-22T02:53:20.123Z",
        }
    ]
    assert "sinceUnixMs" not in answer.out


async def test_inventory_marks_a_device_the_discovery_agent_left_out_of_the_slices(
    bus: Bus, nats_settings: NATSSettings
):
    inv = inventory()
    why = "invalid: attribute 'chipName': string is longer than 64 bytes"
    inv.devices.add(name="gpu-long", kind="gpu", unpublished=why)
    key = bus.names.inventory_key(DRIVER, NODE)
    await bus.kv_put(bus.names.inventory_bucket, key, codec.encode(inv))
    narrow = await dractl(nats_settings, "inventory")
    assert narrow.code == 0, narrow.err
    rows = {line.split()[0]: line.split()[-1] for line in narrow.out.splitlines()[1:]}
    assert rows == {"gpu-0": "yes", "gpu-long": "no"}
    assert "1 device(s) not published in ResourceSlices" in narrow.err
    assert "-o wide" in narrow.err
    wide = await dractl(nats_settings, "inventory", "-o", "wide")
    assert why in wide.out
    as_json = await dractl(nats_settings, "inventory", "-o", "json")
    devices = {d["name"]: d for d in json.loads(as_json.out)}
    assert (devices["gpu-long"]["published"], devices["gpu-long"]["unpublished"]) == (False, why)
    assert (devices["gpu-0"]["published"], devices["gpu-0"]["unpublished"]) == (True, None)
    assert as_json.err == ""


async def test_yaml_says_what_json_says(bus: Bus, nats_settings: NATSSettings):
    await publish_node(bus)
    as_json = await dractl(nats_settings, "inventory", "-o", "json")
    as_yaml = await dractl(nats_settings, "inventory", "-o", "yaml")
    assert yaml.safe_load(as_yaml.out) == json.loads(as_json.out)
    [device] = json.loads(as_json.out)
    assert (device["node"], device["name"], device["attributes"]) == (
        NODE,
        "gpu-0",
        {"numaNode": 1},
    )


CONDITIONS = "gpu-0:Ready,Healthy"
"""The device's conditions as its claim's status.devices has them (healthy, prepared)."""


async def test_claims_lists_devices_pods_and_state(bus: Bus, nats_settings: NATSSettings):
    await publish_node(bus)
    await publish_node(bus, node="node-b")
    table = await dractl(nats_settings, "claims")
    assert table.code == 0, table.err
    header, *rows = table.out.splitlines()
    assert header.split() == [
        "NAMESPACE", "NAME", "NODE", "DEVICES", "PODS", "CONDITIONS", "STATE", "AGE"
    ]  # fmt: skip
    assert [row.split()[:7] for row in rows] == [
        ["team-a", "train", node, "gpu-0", "trainer-0", CONDITIONS, "PREPARED"]
        for node in ("node-a", "node-b")
    ]
    assert all(re.fullmatch(r"9\d s".replace(" ", ""), row.split()[7]) for row in rows)  # 90s ago

    one = await dractl(nats_settings, "claims", "--node", "node-b", "-o", "json")
    [claim] = json.loads(one.out)
    assert claim["node"] == "node-b"
    assert claim["pods"] == [{"namespace": "team-a", "name": "trainer-0", "uid": "pod-1"}]
    assert claim["devices"][0]["cdiDeviceIds"] == [f"k8s.{DRIVER}/claim=uid-1-gpu-0"]
    assert claim["state"] == "PREPARED"
    assert claim["prepared"].endswith("Z")
    assert [c["type"] for c in claim["devices"][0]["conditions"]] == ["Ready", "Healthy"]


async def test_alerts_table_has_an_age_and_json_is_a_list(bus: Bus, nats_settings: NATSSettings):
    await publish_alert(bus)
    table = await dractl(nats_settings, "alerts")
    assert table.code == 0, table.err
    header, row = table.out.splitlines()
    assert header.split() == ["AGE", "STATUS", "NODE", "DEVICE", "CAUSE", "CODE"]
    assert row.split()[1:] == ["RAISED", NODE, "gpu-0", "xid", "79"]

    listing = await dractl(nats_settings, "alerts", "-o", "json")
    [alert] = json.loads(listing.out)
    assert alert["raised"] == "2025-11-22T02:53:20.123Z"
    assert alert["resolved"] is None
    assert alert["status"] == "RAISED"


async def test_global_flags_go_before_or_after_the_subcommand(
    bus: Bus, nats_settings: NATSSettings
):
    await publish_node(bus)
    before = await dractl(nats_settings, "-o", "json", "--node-name", NODE, "inventory")
    after = await dractl(nats_settings, "inventory", "-o", "json", "--node-name", NODE)
    assert before.code == after.code == 0
    assert json.loads(before.out) == json.loads(after.out)
