"""dractl at the edges an operator meets first: a healthy stack without alerts, and a reader
that stops early (`dractl ... | head`)."""

from __future__ import annotations

import asyncio
import json
import os
import sys

import pytest

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


async def test_no_alerts_on_a_stack_with_agents_is_an_empty_listing_not_an_error(
    bus: Bus, nats_settings: NATSSettings
):
    await publish_node(bus)  # the agents published; no alert was ever raised
    table = await dractl(nats_settings, "alerts")
    assert (table.code, table.out) == (0, "")
    assert table.err == "No resources found: no alerts in the stream.\n"
    as_json = await dractl(nats_settings, "alerts", "-o", "json")
    assert (as_json.code, json.loads(as_json.out)) == (0, [])


async def test_alerts_follow_waits_for_the_first_alert(bus: Bus, nats_settings: NATSSettings):
    await publish_node(bus)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "services.dractl", "alerts", "--follow", "-o", "json"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={
            **os.environ,
            "NATS_URL": nats_settings.url,
            "NATS_NAMESPACE": nats_settings.namespace,
        },
    )
    try:
        await asyncio.sleep(1.5)  # following, with no stream yet
        assert process.returncode is None
        await publish_alert(bus)
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), 10)
        assert json.loads(line)["id"] == "a1"
    finally:
        process.terminate()
        await process.wait()


async def test_a_reader_that_stops_early_is_no_failure_and_no_traceback(
    bus: Bus, nats_settings: NATSSettings
):
    big = inventory()
    for i in range(1, 3000):  # a table far beyond a pipe's buffer
        big.devices.add(name=f"gpu-{i}", kind="gpu", capacity={"memory": "80Gi"})
    key = bus.names.inventory_key(DRIVER, NODE)
    await bus.kv_put(bus.names.inventory_bucket, key, codec.encode(big))
    for output in ("table", "json"):
        read, write = os.pipe()
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            *("-m", "services.dractl", "inventory", "-o", output),
            stdout=write,
            stderr=asyncio.subprocess.PIPE,
            env={
                **os.environ,
                "NATS_URL": nats_settings.url,
                "NATS_NAMESPACE": nats_settings.namespace,
                "NODE_NAME": NODE,
                "DRIVER_NAME": DRIVER,
            },
        )
        os.close(write)
        with os.fdopen(read, "rb") as head:
            assert await asyncio.to_thread(head.readline)  # `| head -1`, then the pipe closes
        assert process.stderr is not None
        err = await asyncio.wait_for(process.stderr.read(), 30)
        assert await process.wait() == 0, err.decode()
        assert b"Traceback" not in err
        assert b"BrokenPipe" not in err
