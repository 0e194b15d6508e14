"""The fleet view: `inventory` and `health` across nodes (`--all-nodes`, or a glob in
`--node-name`), with a NODE column and healthy/unhealthy/unknown counts, in every format;
`alerts --follow` shows every node's alerts; a value forged under another node's key is
skipped; without a reachable NATS dractl says so in one line and exits non-zero."""

from __future__ import annotations

import asyncio
import json
import sys

import pytest
import yaml

from shared.bus import codec
from shared.bus.connection import Bus
from shared.config import NATSSettings
from shared.pb.drasuite.v1 import alert_pb2, health_pb2, inventory_pb2
from tests.integration.dractl.dractl_process import (
    DRIVER,
    SINCE_MS,
    dractl,
    inventory,
    publish_alert,
)

pytestmark = pytest.mark.integration

NODES = ("gpu-node-1", "gpu-node-2", "npu-node-1")


def _two_devices(node: str) -> inventory_pb2.Inventory:
    inv = inventory(node)
    inv.devices.add(name="gpu-1", kind="gpu")
    return inv


def _record(
    node: str, device: str, state: health_pb2.HealthState.ValueType
) -> health_pb2.DeviceHealth:
    return health_pb2.DeviceHealth(
        driver=DRIVER, node=node, pool=node, device=device, state=state, since_unix_ms=SINCE_MS
    )


async def _fleet(bus: Bus) -> None:
    """Three nodes of two devices; gpu-node-2's gpu-1 is unhealthy, npu-node-1's gpu-1 has
    no record yet (unknown)."""
    names = bus.names
    for node in NODES:
        await bus.kv_put(
            names.inventory_bucket,
            names.inventory_key(DRIVER, node),
            codec.encode(_two_devices(node)),
        )
        for device in ("gpu-0", "gpu-1"):
            if (node, device) == ("npu-node-1", "gpu-1"):
                continue
            state = (
                health_pb2.HEALTH_STATE_UNHEALTHY
                if (node, device) == ("gpu-node-2", "gpu-1")
                else health_pb2.HEALTH_STATE_HEALTHY
            )
            await bus.kv_put(
                names.health_bucket,
                names.health_key(DRIVER, node, device),
                codec.encode(_record(node, device, state)),
            )


async def test_health_across_nodes_has_a_node_column_and_counts(
    bus: Bus, nats_settings: NATSSettings
):
    await _fleet(bus)
    answer = await dractl(nats_settings, "health", "--all-nodes")
    assert answer.code == 0, answer.err
    header, *rows, counts = answer.out.splitlines()
    assert header.split()[:3] == ["NODE", "DEVICE", "STATE"]
    assert [row.split()[:3] for row in rows] == [
        ["gpu-node-1", "gpu-0", "HEALTHY"],
        ["gpu-node-1", "gpu-1", "HEALTHY"],
        ["gpu-node-2", "gpu-0", "HEALTHY"],
        ["gpu-node-2", "gpu-1", "UNHEALTHY"],
        ["npu-node-1", "gpu-0", "HEALTHY"],
        ["npu-node-1", "gpu-1", "UNSPECIFIED"],
    ]
    assert counts == "nodes: 3  healthy: 4  unhealthy: 1  unknown: 1"

    answer = await dractl(nats_settings, "-o", "json", "health", "-A")
    document = json.loads(answer.out)
    assert document["counts"] == {"nodes": 3, "healthy": 4, "unhealthy": 1, "unknown": 1}
    assert len(document["items"]) == 6


@pytest.mark.parametrize("output", ["json", "yaml"])
async def test_a_glob_in_node_name_picks_the_nodes(
    bus: Bus, nats_settings: NATSSettings, output: str
):
    await _fleet(bus)
    answer = await dractl(nats_settings, "health", "-o", output, node="gpu-node-*")
    assert answer.code == 0, answer.err
    document = yaml.safe_load(answer.out)  # JSON is YAML too
    assert {item["node"] for item in document["items"]} == {"gpu-node-1", "gpu-node-2"}
    assert document["counts"] == {"nodes": 2, "healthy": 3, "unhealthy": 1, "unknown": 0}

    answer = await dractl(nats_settings, "inventory", "-o", output, node="*-1")
    devices = yaml.safe_load(answer.out)
    assert sorted({(d["node"], d["name"]) for d in devices}) == [
        (node, device) for node in ("gpu-node-1", "npu-node-1") for device in ("gpu-0", "gpu-1")
    ]


async def test_inventory_across_nodes_as_a_table(bus: Bus, nats_settings: NATSSettings):
    await _fleet(bus)
    answer = await dractl(nats_settings, "inventory", "--all-nodes")
    header, *rows = answer.out.splitlines()
    assert header.split()[:2] == ["NODE", "DEVICE"]
    assert [row.split()[:2] for row in rows] == [[n, d] for n in NODES for d in ("gpu-0", "gpu-1")]

    answer = await dractl(nats_settings, "inventory", "--all-nodes", node="cpu-*")
    assert answer.code == 0
    assert answer.out == ""
    assert answer.err == "No resources found: no inventory on any node matching cpu-*.\n"


async def test_a_value_under_another_nodes_key_is_skipped_not_shown(
    bus: Bus, nats_settings: NATSSettings
):
    await _fleet(bus)
    names = bus.names
    forged = _two_devices("gpu-node-1")  # written under npu-node-1's key
    key = names.inventory_key(DRIVER, "npu-node-1")
    await bus.kv_put(names.inventory_bucket, key, codec.encode(forged))
    answer = await dractl(nats_settings, "-o", "json", "inventory", "-A")
    assert answer.code == 0, answer.err
    assert {d["node"] for d in json.loads(answer.out)} == {"gpu-node-1", "gpu-node-2"}
    assert "skipped" in answer.err
    assert key in answer.err


async def test_alerts_follow_shows_every_nodes_alerts(bus: Bus, nats_settings: NATSSettings):
    await publish_alert(bus, node="gpu-node-1")
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "services.dractl",
        f"--nats-url={nats_settings.url}",
        f"--nats-namespace={nats_settings.namespace}",
        f"--driver-name={DRIVER}",
        "-o",
        "json",
        "alerts",
        "--follow",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        first = json.loads(await asyncio.wait_for(process.stdout.readline(), 20))
        alert = alert_pb2.Alert(
            id="a2", status=alert_pb2.ALERT_STATUS_RAISED, driver=DRIVER, node="npu-node-1"
        )
        subject = bus.names.alerts(DRIVER, "npu-node-1")
        await bus.publish_js(subject, codec.encode_json(alert), msg_id="a2")
        second = json.loads(await asyncio.wait_for(process.stdout.readline(), 20))
    finally:
        process.terminate()
        await process.wait()
    assert [first["node"], second["node"]] == ["gpu-node-1", "npu-node-1"]


async def test_without_a_reachable_nats_one_line_and_a_failure_code(nats_settings: NATSSettings):
    unreachable = NATSSettings(url="nats://127.0.0.1:1", namespace=nats_settings.namespace)
    for args in (("health", "--all-nodes"), ("inventory",), ("alerts",)):
        answer = await dractl(unreachable, "--nats-connect-timeout-s", "1", *args)
        assert answer.code != 0
        assert answer.out == ""
        (line,) = answer.err.splitlines()
        assert line.startswith("dractl: ")
        assert "nats" in line.lower()
