"""dractl's `-o json` and `-o yaml`: plain objects with human field names and RFC 3339 times.

Not proto JSON (`sinceUnixMs: "1763..."`, enum names with their prefixes): one item per table
row, the same names in JSON and YAML, a time as `2026-11-24T08:07:58.533Z` (null when unset).
A listing is one document, a list; `alerts --follow` writes one object per line instead
(as `kubectl get -w -o json` does), since a stream never ends. No I/O beyond the given stream.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

import yaml

from shared import device_conditions
from shared.pb.drasuite.v1 import alert_pb2, claim_pb2, health_pb2, inventory_pb2

__all__ = ["alert", "claim", "device", "devices", "dump", "health", "rfc3339", "state_name"]

Item = dict[str, Any]


def rfc3339(unix_ms: int) -> str | None:
    if unix_ms <= 0:
        return None
    moment = datetime.fromtimestamp(unix_ms / 1000, tz=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def state_name(enum: Any, value: int, prefix: str) -> str:
    """`HEALTH_STATE_HEALTHY` -> `HEALTHY`; an unknown number stays a number."""
    try:
        return str(enum.Name(value)).removeprefix(prefix)
    except ValueError:
        return str(value)


def _attribute(value: inventory_pb2.AttributeValue) -> Any:
    kind = value.WhichOneof("value")
    return None if kind is None else getattr(value, kind)


def device(inv: inventory_pb2.Inventory, dev: inventory_pb2.Device) -> Item:
    return {
        "driver": inv.driver,
        "node": inv.node,
        "pool": inv.pool,
        "generation": inv.generation,
        "name": dev.name,
        "kind": dev.kind,
        "capacity": dict(sorted(dev.capacity.items())),
        "attributes": {k: _attribute(v) for k, v in sorted(dev.attributes.items())},
        # The discovery agent marks a device it leaves out of the ResourceSlices.
        "published": not dev.unpublished,
        "unpublished": dev.unpublished or None,
    }


def devices(inv: inventory_pb2.Inventory) -> list[Item]:
    return [device(inv, dev) for dev in inv.devices]


def taint_text(taint: health_pb2.DeviceTaint) -> str:
    value = f"={taint.value}" if taint.value else ""
    return f"{taint.key}{value}:{taint.effect}"


def health(record: health_pb2.DeviceHealth) -> Item:
    return {
        "driver": record.driver,
        "node": record.node,
        "pool": record.pool,
        "device": record.device,
        "state": state_name(health_pb2.HealthState, record.state, "HEALTH_STATE_"),
        "cause": record.cause,
        "code": record.code,
        "message": record.message,
        "since": rfc3339(record.since_unix_ms),
        "updated": rfc3339(record.updated_unix_ms),
        "taints": [
            {
                "key": t.key,
                "value": t.value,
                "effect": t.effect,
                "timeAdded": rfc3339(t.time_added_unix_ms),
            }
            for t in record.taints
        ],
    }


def alert(message: alert_pb2.Alert) -> Item:
    return {
        "id": message.id,
        "status": state_name(alert_pb2.AlertStatus, message.status, "ALERT_STATUS_"),
        "driver": message.driver,
        "node": message.node,
        "pool": message.pool,
        "device": message.device,
        "cause": message.cause,
        "code": message.code,
        "message": message.message,
        "taint": message.taint,
        "raised": rfc3339(message.raised_unix_ms),
        "resolved": rfc3339(message.resolved_unix_ms),
        "traceId": message.trace_id,
    }


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


def claim(
    prepared: claim_pb2.PreparedClaim,
    health: Mapping[tuple[str, str], health_pb2.DeviceHealth] | None = None,
) -> Item:
    """`health`: the health records by (node, device), from which device conditions come."""
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


def dump(items: Sequence[Item] | Item, *, output: str, out: TextIO) -> None:
    """One document: `json` (indented) or `yaml`; `json-line` is one object on one line."""
    if output == "yaml":
        yaml.safe_dump(items, out, sort_keys=False, allow_unicode=True)
    elif output == "json-line":
        out.write(json.dumps(items, separators=(",", ":")) + "\n")
    else:
        out.write(json.dumps(items, indent=2) + "\n")
    out.flush()
