"""dractl when something is wrong: an unknown node or driver, a fresh bus, an unreachable
server, a typo; and what it must never do (create buckets, show another node's forged data)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import nats.js.errors
import pytest

from shared.bus import codec
from shared.bus.connection import Bus
from shared.config import NATSSettings
from tests.integration.dractl.dractl_process import (
    DRIVER,
    NODE,
    dractl,
    drained_health,
    inventory,
    publish_node,
)

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("command", ["inventory", "health"], ids=["inventory", "health"])
async def test_a_wrong_node_name_says_no_such_node_and_exits_1(
    bus: Bus, nats_settings: NATSSettings, command: str
):
    await publish_node(bus)
    answer = await dractl(nats_settings, command, "--node-name", "node-typo")
    assert answer.code == 1
    assert answer.out == ""
    assert f"no such node: node-typo for driver {DRIVER} (nodes: {NODE})" in answer.err


async def test_a_wrong_driver_name_says_no_such_driver(bus: Bus, nats_settings: NATSSettings):
    await publish_node(bus)
    for command in (["health"], ["claims"], ["claims", "--node", NODE]):
        answer = await dractl(nats_settings, "--driver-name", "gpu.example.com", *command)
        assert answer.code == 1, command
        assert "no such driver: gpu.example.com" in answer.err, command


async def test_read_only_commands_on_a_fresh_bus_create_nothing_and_say_no_data_yet(
    bus: Bus, nats_settings: NATSSettings
):
    for command in ("inventory", "health", "claims", "alerts"):
        answer = await dractl(nats_settings, command)
        assert answer.code == 1, command
        assert "no data yet" in answer.err or "no alerts yet" in answer.err, answer.err
    names = bus.names
    for stream in (
        *(f"KV_{bucket}" for bucket in names.buckets),
        names.alerts_stream,
    ):
        with pytest.raises(nats.js.errors.NotFoundError):
            await bus.js.stream_info(stream)


async def test_a_node_without_claims_is_an_empty_listing_not_an_error(
    bus: Bus, nats_settings: NATSSettings
):
    names = bus.names
    await bus.kv_put(
        names.inventory_bucket, names.inventory_key(DRIVER, "node-c"), b""
    )  # an empty inventory does not make a node
    answer = await dractl(nats_settings, "claims", "--node", "node-c")
    assert answer.code == 1
    await publish_node(bus, node="node-d")
    await bus.kv_delete(names.claims_bucket, names.claim_key(DRIVER, "node-d", "uid-1"))
    empty = await dractl(nats_settings, "claims", "--node", "node-d")
    assert (empty.code, empty.out) == (0, "")
    assert "No resources found: no prepared claims on node-d." in empty.err
    as_json = await dractl(nats_settings, "claims", "--node", "node-d", "-o", "json")
    assert json.loads(as_json.out) == []


async def test_a_record_forged_under_another_nodes_key_is_skipped_not_shown(
    bus: Bus, nats_settings: NATSSettings
):
    """Whoever may write node-a's keys must not make dractl show data for node-b there."""
    await publish_node(bus)
    forged = drained_health(node="node-b")
    forged.device = "gpu-9"
    names = bus.names
    await bus.kv_put(
        names.health_bucket, names.health_key(DRIVER, NODE, "gpu-9"), codec.encode(forged)
    )
    answer = await dractl(nats_settings, "health", "-o", "json")
    assert answer.code == 0, answer.err
    assert [r["device"] for r in json.loads(answer.out)] == ["gpu-0"]
    assert "skipped" in answer.err
    assert "node-b" in answer.err


async def test_the_connect_timeout_flag_is_honoured(nats_settings: NATSSettings):
    unreachable = NATSSettings(url="nats://192.0.2.1:4222", namespace=nats_settings.namespace)
    started = time.monotonic()
    await dractl(unreachable, "--version")
    start_up_s = time.monotonic() - started  # the interpreter's share, on this machine now
    started = time.monotonic()
    answer = await dractl(unreachable, "--nats-connect-timeout-s", "0.5", "inventory")
    took = time.monotonic() - started
    assert answer.code == 1
    assert "cannot reach NATS at nats://192.0.2.1:4222 within 0.5s" in answer.err
    assert took < start_up_s + 3.0  # the old fixed wait was 5 s


async def test_fault_and_drain_answer_in_json_when_asked(bus: Bus, nats_settings: NATSSettings):
    async def health_agent(msg):  # the node's health agent, answering as it does
        await msg.respond(json.dumps({"ok": True}).encode())

    names = bus.names
    await bus.subscribe(names.drain_control(DRIVER, NODE), health_agent)
    await bus.subscribe(names.fault_control(DRIVER, NODE), health_agent)
    drained = await dractl(nats_settings, "drain", "gpu-0", "--reason", "RMA", "-o", "json")
    assert drained.code == 0, drained.err
    assert json.loads(drained.out) == {
        "driver": DRIVER,
        "node": NODE,
        "device": "gpu-0",
        "action": "drain",
        "ok": True,
    }
    fault = await dractl(nats_settings, "fault", "clear", "gpu-0", "-o", "yaml")
    assert "action: clear" in fault.out
    text = await dractl(nats_settings, "undrain", "gpu-0")
    assert text.out == f"{NODE}/gpu-0 undrained\n"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["inventroy"], "invalid choice: 'inventroy'"),
        (["-o", "xml", "inventory"], "invalid choice: 'xml'"),
        (["fault", "explode", "gpu-0"], "invalid choice: 'explode'"),
    ],
    ids=["typo", "bad-output", "bad-action"],
)
def test_usage_errors_are_two_lines_and_exit_2(argv: list[str], message: str):
    answer = subprocess.run(
        [sys.executable, "-m", "services.dractl", *argv],
        capture_output=True,
        text=True,
        check=False,
    )
    assert answer.returncode == 2
    lines = answer.stderr.splitlines()
    assert len(lines) == 2
    assert message in lines[0]
    assert re.fullmatch(r"See 'dractl( fault)? --help' for usage\.", lines[1])


def test_version_and_completion_scripts():
    version = subprocess.run(
        [sys.executable, "-m", "services.dractl", "--version"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert version.stdout.startswith("dractl ")
    for shell in ("bash", "zsh"):
        script = subprocess.run(
            [sys.executable, "-m", "services.dractl", "completion", shell],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert "complete -F _dractl dractl" in script
        assert "claims" in script
        assert "table wide json yaml" in script
        checked = subprocess.run(["bash", "-n"], input=script, text=True, check=False)
        assert checked.returncode == 0, shell


async def test_an_inventory_naming_another_node_is_refused(bus: Bus, nats_settings: NATSSettings):
    names = bus.names
    forged = codec.encode(inventory(node="node-b"))
    await bus.kv_put(names.inventory_bucket, names.inventory_key(DRIVER, NODE), forged)
    answer = await dractl(nats_settings, "inventory")
    assert answer.code == 1
    assert answer.out == ""
    assert "inventory of node-a not shown" in answer.err
