"""dractl as users run it (a process against a real nats-server), and the bus state it reads,
written the way the agents write it."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from dataclasses import dataclass

from shared.bus import codec
from shared.bus.connection import Bus
from shared.config import NATSSettings
from shared.pb.drasuite.v1 import alert_pb2, claim_pb2, health_pb2, inventory_pb2

DRIVER, NODE = "sim.dra-suite.io", "node-a"
SINCE_MS = 1_763_780_000_123  # 2025-11-22T02:53:20.123Z
# The machine's own settings must not leak into the process under test.
_OURS = ("NATS_", "NODE_NAME", "DRIVER_NAME", "COLUMNS")


@dataclass(frozen=True, slots=True)
class Answer:
    code: int
    out: str
    err: str


async def dractl(settings: NATSSettings, *args: str, node: str = NODE) -> Answer:
    """`dractl <args>` with the test server, namespace, driver and node given as env twins."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "services.dractl",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith(_OURS)},
            "NATS_URL": settings.url,
            "NATS_NAMESPACE": settings.namespace,
            "DRIVER_NAME": DRIVER,
            "NODE_NAME": node,
            "COLUMNS": "80",
        },
    )
    out, err = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode is not None
    return Answer(process.returncode, out.decode(), err.decode())


def inventory(node: str = NODE) -> inventory_pb2.Inventory:
    return inventory_pb2.Inventory(
        driver=DRIVER,
        node=node,
        pool=node,
        generation=3,
        devices=[
            inventory_pb2.Device(
                name="gpu-0",
                kind="gpu",
                capacity={"memory": "80Gi"},
                attributes={"numaNode": inventory_pb2.AttributeValue(int=1)},
            )
        ],
    )


def drained_health(node: str = NODE) -> health_pb2.DeviceHealth:
    """A healthy device with a manual drain: its taint is only in `taints`."""
    return health_pb2.DeviceHealth(
        driver=DRIVER,
        node=node,
        pool=node,
        device="gpu-0",
        state=health_pb2.HEALTH_STATE_HEALTHY,
        since_unix_ms=SINCE_MS,
        updated_unix_ms=SINCE_MS,
        taints=[
            health_pb2.DeviceTaint(
                key=f"{DRIVER}/drain",
                value="RMA-4711",
                effect="NoSchedule",
                time_added_unix_ms=SINCE_MS,
            )
        ],
    )


def prepared_claim(node: str = NODE) -> claim_pb2.PreparedClaim:
    return claim_pb2.PreparedClaim(
        driver=DRIVER,
        node=node,
        claim_uid="uid-1",
        namespace="team-a",
        name="train",
        devices=[
            claim_pb2.PreparedClaimDevice(
                request_names=["gpus"],
                pool=node,
                device="gpu-0",
                cdi_device_ids=[f"k8s.{DRIVER}/claim=uid-1-gpu-0"],
            )
        ],
        pods=[claim_pb2.ClaimPod(namespace="team-a", name="trainer-0", uid="pod-1")],
        state=claim_pb2.PREPARED_CLAIM_STATE_PREPARED,
        prepared_unix_ms=int(time.time() * 1000) - 90_000,
    )


async def publish_node(bus: Bus, node: str = NODE) -> None:
    """Inventory, health and a prepared claim of `node`, as its agents publish them."""
    names = bus.names
    await bus.kv_put(
        names.inventory_bucket, names.inventory_key(DRIVER, node), codec.encode(inventory(node))
    )
    await bus.kv_put(
        names.health_bucket,
        names.health_key(DRIVER, node, "gpu-0"),
        codec.encode(drained_health(node)),
    )
    await bus.kv_put(
        names.claims_bucket,
        names.claim_key(DRIVER, node, "uid-1"),
        codec.encode(prepared_claim(node)),
    )


async def publish_alert(bus: Bus, node: str = NODE) -> None:
    await bus.ensure_stream(
        name=bus.names.alerts_stream,
        subjects=[bus.names.alerts_wildcard],
        max_age_s=3600,
        duplicate_window_s=60,
    )
    alert = alert_pb2.Alert(
        schema_version=1,
        id="a1",
        status=alert_pb2.ALERT_STATUS_RAISED,
        driver=DRIVER,
        node=node,
        pool=node,
        device="gpu-0",
        cause="xid",
        code="79",
        message="GPU has fallen off the bus",
        taint=f"{DRIVER}/xid=79:NoSchedule",
        raised_unix_ms=SINCE_MS,
    )
    await bus.publish_js(bus.names.alerts(DRIVER, node), codec.encode_json(alert), msg_id="a1")
