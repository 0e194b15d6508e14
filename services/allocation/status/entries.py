"""This driver's entries of a claim's `status.devices` (AllocatedDeviceStatus), pure.

One entry per prepared device (per share of a shared one): driver, pool, device, `shareID`,
`conditions` (`Ready`, and `Healthy` from the health agent's verdict) and `data` (UUID, PCI
bus ID, PCIe root, NUMA node, and the partition made for the claim, where known).
`networkData` stays unset: no device of ours is a NIC. `merge` puts them into the claim's list
beside other drivers' entries, which it never touches, keeping each condition's
`lastTransitionTime` while its status stays the same, and only for devices that the claim's
allocation still names (the API server refuses others).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from services.allocation.claim.checkpoint import PreparedClaim
from services.allocation.node_view.health_board import DeviceHealthView
from shared import device_conditions
from shared.device_conditions import Condition
from shared.pb.drasuite.v1 import inventory_pb2

__all__ = ["Entry", "entries", "merge"]

Obj = dict[str, Any]
_DATA_ATTRIBUTES = {
    "resource.kubernetes.io/pciBusID": "pciBusID",
    "resource.kubernetes.io/pcieRoot": "pcieRoot",
    "numaNode": "numaNode",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Entry:
    driver: str
    pool: str
    device: str
    share_id: str | None
    conditions: tuple[Condition, ...]
    data: Mapping[str, Any]

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.driver, self.pool, self.device, self.share_id or "")


def _key(entry: Mapping[str, Any]) -> tuple[str, str, str, str]:
    return (
        str(entry.get("driver", "")),
        str(entry.get("pool", "")),
        str(entry.get("device", "")),
        str(entry.get("shareID") or ""),
    )


def _data(device: inventory_pb2.Device | None, partition: Mapping[str, str] | None) -> Obj:
    data: Obj = {}
    if device is not None:
        if device.uuid:
            data["uuid"] = device.uuid
        for attribute, name in _DATA_ATTRIBUTES.items():
            if attribute in device.attributes:
                value = device.attributes[attribute]
                kind = value.WhichOneof("value")
                if kind is not None:
                    data[name] = getattr(value, kind)
        if device.parent:
            data["parent"] = device.parent
    if partition:
        data["partition"] = dict(partition)
    return data


def entries(
    record: PreparedClaim,
    *,
    node: str,
    inventory: inventory_pb2.Inventory | None,
    health: Mapping[str, DeviceHealthView],
) -> list[Entry]:
    """The entries of a prepared claim, in the order of its devices, each (device, share) once."""
    devices = {d.name: d for d in inventory.devices} if inventory is not None else {}
    partitions = {
        p.device: {"id": p.partition_id, "profile": p.profile}
        for p in record.partitions
        if p.partition_id
    }
    out: dict[tuple[str, str, str, str], Entry] = {}
    for prepared in record.devices:
        view = health.get(prepared.device)
        entry = Entry(
            driver=record.driver,
            pool=prepared.pool,
            device=prepared.device,
            share_id=prepared.share_id,
            conditions=(
                device_conditions.ready(node),
                device_conditions.healthy(
                    str(view.health) if view is not None else "", view.message if view else ""
                ),
            ),
            data=_data(devices.get(prepared.device), partitions.get(prepared.device)),
        )
        out.setdefault(entry.key, entry)
    return list(out.values())


def _allocated(claim: Obj) -> set[tuple[str, str, str, str]]:
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    return {_key(r) for r in results if isinstance(r, Mapping)}


def _condition(
    condition: Condition, previous: Mapping[str, Any] | None, *, generation: int, now: str
) -> Obj:
    same = previous is not None and previous.get("status") == condition.status
    since = previous.get("lastTransitionTime") if same and previous is not None else None
    return {
        "type": condition.type,
        "status": condition.status,
        "observedGeneration": generation,
        "lastTransitionTime": since or now,
        "reason": condition.reason,
        "message": condition.message,
    }


def _entry(entry: Entry, previous: Mapping[str, Any] | None, *, generation: int, now: str) -> Obj:
    before = {
        str(c.get("type")): c
        for c in (previous or {}).get("conditions") or []
        if isinstance(c, Mapping)
    }
    out: Obj = {"driver": entry.driver, "pool": entry.pool, "device": entry.device}
    if entry.share_id is not None:
        out["shareID"] = entry.share_id
    out["conditions"] = [
        _condition(c, before.get(c.type), generation=generation, now=now) for c in entry.conditions
    ]
    if entry.data:
        out["data"] = dict(entry.data)
    return out


def merge(claim: Obj, ours: Sequence[Entry], *, driver: str, now: str) -> list[Obj]:
    """The claim's new `status.devices`: other drivers' entries as they are, then ours (those
    the allocation names). `now` is an RFC 3339 time for conditions that changed."""
    current = [e for e in (claim.get("status") or {}).get("devices") or [] if isinstance(e, dict)]
    previous = {_key(e): e for e in current if e.get("driver") == driver}
    generation = int((claim.get("metadata") or {}).get("generation") or 0)
    allocated = _allocated(claim)
    merged = [e for e in current if e.get("driver") != driver]
    merged += [
        _entry(e, previous.get(e.key), generation=generation, now=now)
        for e in ours
        if e.key in allocated
    ]
    return merged
