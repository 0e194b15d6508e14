"""dractl as a process: stdout carries only the answer, so `dractl -o json ... | jq` works."""

from __future__ import annotations

import asyncio
import json
import sys

import pytest

from shared.bus import codec
from shared.bus.connection import Bus
from shared.config import NATSSettings
from shared.pb.drasuite.v1 import inventory_pb2

pytestmark = pytest.mark.integration

DRIVER, NODE = "sim.dra-suite.io", "node-a"


async def _dractl(settings: NATSSettings, *args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "services.dractl",
        f"--nats-url={settings.url}",
        f"--nats-namespace={settings.namespace}",
        f"--driver-name={DRIVER}",
        f"--node-name={NODE}",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_json_output_is_only_json_and_logs_stay_off_stdout(
    bus: Bus, nats_settings: NATSSettings
):
    inventory = inventory_pb2.Inventory(
        driver=DRIVER, node=NODE, devices=[inventory_pb2.Device(name="gpu-0", kind="gpu")]
    )
    key = bus.names.inventory_key(DRIVER, NODE)
    await bus.kv_put(bus.names.inventory_bucket, key, codec.encode(inventory))

    code, out, err = await _dractl(nats_settings, "-o", "json", "inventory")
    assert code == 0, err
    assert [d["name"] for d in json.loads(out)] == ["gpu-0"]
    assert "nats_connected" not in err  # info logs only with --verbose

    code, out, err = await _dractl(nats_settings, "--verbose", "-o", "json", "inventory")
    assert code == 0, err
    assert json.loads(out)[0]["node"] == NODE
    assert "nats_connected" in err
