"""`dractl claims`: the claims prepared on a node (`--node`), or on every node of the driver,
with each device's conditions as the allocation agent publishes them on its claim."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TextIO

from services.dractl import queries
from services.dractl.bus_session import bus_session
from services.dractl.document import Item, rfc3339, state_name
from services.dractl.output import Output, listing
from services.dractl.render import Column, age, joined
from services.dractl.subcommands import Subcommands
from shared import device_conditions
from shared.bus.connection import Bus
from shared.pb.drasuite.v1 import claim_pb2, health_pb2

__all__ = ["NAME", "columns", "conditions", "item", "register", "run"]

NAME = "claims"

HealthRecords = Mapping[tuple[str, str], health_pb2.DeviceHealth]
"""Health records by (node, device)."""


def register(subcommands: Subcommands) -> None:
    text = "claims prepared on a node (all nodes without --node)"
    parser = subcommands.add(NAME, summary=text, description=text)
    parser.add_argument("--node", help="only this node's claims")


async def run(args: argparse.Namespace, *, out: TextIO, err: TextIO) -> int:
    output = Output.of(args.output, out=out, err=err)
    driver = args.driver_name
    async with bus_session(args) as bus:
        now = datetime.now(UTC)
        prepared = await queries.claims(bus, driver=driver, node=args.node)
        health = await _health_of(bus, driver, {c.node for c in prepared})
        items = [item(c, health) for c in prepared]
        where = f"on {args.node}" if args.node else f"for driver {driver}"
        listing(items, columns(now=now), output, empty=f"no prepared claims {where}")
    return 0


async def _health_of(bus: Bus, driver: str, nodes: set[str]) -> HealthRecords:
    """The health records of `nodes`: the source of the claims' device conditions. A node
    without records (or unknown to the bus) gives none."""
    found: dict[tuple[str, str], health_pb2.DeviceHealth] = {}
    for node in sorted(nodes):
        try:
            records = await queries.health(bus, driver=driver, node=node)
        except queries.CommandError:
            continue
        found.update({(node, r.device): r for r in records})
    return found


def columns(*, now: datetime) -> list[Column]:
    return [
        Column("NAMESPACE", lambda c: c["namespace"]),
        Column("NAME", lambda c: c["name"]),
        Column("NODE", lambda c: c["node"]),
        Column("DEVICES", _devices),
        Column("PODS", lambda c: joined([p["name"] for p in c["pods"]])),
        Column("CONDITIONS", _conditions),
        Column("STATE", lambda c: c["state"]),
        Column("AGE", lambda c: age(c["prepared"], now=now)),
        Column("UID", lambda c: c["uid"], wide=True),
        Column(
            "CDI",
            lambda c: joined([i for d in c["devices"] for i in d["cdiDeviceIds"]]),
            wide=True,
        ),
    ]


def _devices(claim: Item) -> str:
    return joined(
        [d["device"] + (f"/{d['shareId']}" if d["shareId"] else "") for d in claim["devices"]]
    )


def _conditions(claim: Item) -> str:
    """Per device `<device>:Ready,Healthy`; a condition not True shows its status."""
    shown = []
    for device in claim["devices"]:
        parts = [
            c["type"] if c["status"] == "True" else f"{c['type']}={c['status']}"
            for c in device.get("conditions", [])
        ]
        shown.append(f"{device['device']}:{','.join(parts)}")
    return " ".join(shown) or "<none>"


_HEALTH = {
    health_pb2.HEALTH_STATE_HEALTHY: "Healthy",
    health_pb2.HEALTH_STATE_UNHEALTHY: "Unhealthy",
}


def conditions(node: str, record: health_pb2.DeviceHealth | None) -> list[Item]:
    """A prepared device's conditions as the allocation agent publishes them on its claim
    (`status.devices`): Ready, and Healthy from the same health record."""
    health = _HEALTH.get(record.state, "") if record is not None else ""
    found = [
        device_conditions.ready(node),
        device_conditions.healthy(health, record.message if record is not None else ""),
    ]
    return [
        {"type": c.type, "status": c.status, "reason": c.reason, "message": c.message}
        for c in found
    ]


def item(prepared: claim_pb2.PreparedClaim, health: HealthRecords | None = None) -> Item:
    """A prepared claim as `-o json|yaml` shows it (and a table's row); `health`: the health
    records from which device conditions come."""
    records = health or {}
    return {
        "driver": prepared.driver,
        "node": prepared.node,
        "namespace": prepared.namespace,
        "name": prepared.name,
        "uid": prepared.claim_uid,
        "state": state_name(claim_pb2.PreparedClaimState, prepared.state, "PREPARED_CLAIM_STATE_"),
        "prepared": rfc3339(prepared.prepared_unix_ms),
        "devices": [
            {
                "requests": list(d.request_names),
                "pool": d.pool,
                "device": d.device,
                "shareId": d.share_id,
                "cdiDeviceIds": list(d.cdi_device_ids),
                "conditions": conditions(prepared.node, records.get((prepared.node, d.device))),
            }
            for d in prepared.devices
        ],
        "pods": [{"namespace": p.namespace, "name": p.name, "uid": p.uid} for p in prepared.pods],
    }
