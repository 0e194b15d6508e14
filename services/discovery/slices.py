"""Desired ResourceSlices of the node's pool, and the plan that turns actual into desired (pure).

`desired()` maps an inventory (plus optional device taints) to slice contents by the rules of
the API server's version (`apirules`, laid out by `layout`): devices split at 128 per slice
(64 when taints or counter consumption are involved, and always with `taintable`), shared
counters in slices of their own from 1.35 and next to their consumers on 1.34. `syncplan`
compares them with the slices that exist and decides the writes and the pool generation.

Names follow v0.36 of the Go helper: `generateName` `<index>-<driver>-<node>-`, the index in
hex, at least 5 digits, so that the scheduler, which tries slices in name order, tries them in
pool order. Existing slices are matched to desired ones by content first (same device and
counter-set names), then by that index prefix, then in name order; a slice is never renamed.
So slices published under v0.34/v0.35 names (`<node>-<driver>-`) by an older agent are
adopted as they are, without a delete or create, and only new slices get the new names.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from services.discovery import apirules, layout, validation
from services.discovery.layout import (
    MAX_COUNTER_SETS,
    MAX_DEVICES,
    MAX_DEVICES_ADVANCED,
    Rejection,
    split,
)
from shared.pb.drasuite.v1 import inventory_pb2

__all__ = [
    "API_VERSION",
    "GENERATE_NAME_MAX",
    "MAX_COUNTER_SETS",
    "MAX_DEVICES",
    "MAX_DEVICES_ADVANCED",
    "Content",
    "DesiredPool",
    "Owner",
    "Rejection",
    "attribute_json",
    "content_id",
    "content_of",
    "desired",
    "device_json",
    "fingerprint",
    "generate_name",
    "normalize",
    "slice_index",
    "split",
]

API_VERSION = "resource.k8s.io/v1"
# The apiserver keeps at most 58 characters of a generateName and appends 5 random ones.
GENERATE_NAME_MAX = 58
_INDEX_WIDTH = 5
_INDEX = re.compile(r"^([0-9a-f]{5,})-")
NEWEST_RULES = apirules.for_minor(apirules.NEWEST)

Obj = dict[str, Any]
Content = dict[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class DesiredPool:
    """The slices a pool should have: one spec fragment (devices or counters) per slice."""

    driver: str
    node: str
    pool: str
    contents: tuple[Content, ...]
    rejected: tuple[Rejection, ...] = ()
    withheld: tuple[str, ...] = ()
    """Devices valid in themselves that the server's rules leave out (partitions, gate off)."""

    def without(self, rejected: Collection[str]) -> DesiredPool:
        """The pool minus contents (by `content_id`) that the API server rejected."""
        kept = tuple(c for c in self.contents if content_id(c) not in rejected)
        if len(kept) == len(self.contents):
            return self
        return dataclasses.replace(self, contents=kept or ({"devices": []},))

    def spec(self, content: Content, *, generation: int) -> Obj:
        pool = {
            "name": self.pool,
            "generation": generation,
            "resourceSliceCount": len(self.contents),
        }
        return {"driver": self.driver, "nodeName": self.node, "pool": pool, **content}


@dataclass(frozen=True, slots=True)
class Owner:
    """The Node that owns the slices (garbage-collected with it)."""

    name: str
    uid: str

    def reference(self) -> Obj:
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "name": self.name,
            "uid": self.uid,
            "controller": True,
        }


def attribute_json(value: inventory_pb2.AttributeValue) -> Obj:
    """`{"int": 3}`, `{"bool": true}`, `{"string": "x"}` or `{"version": "1.2.3"}`."""
    kind = value.WhichOneof("value")
    if kind is None:
        raise ValueError("attribute value has no value")
    return {kind: getattr(value, kind)}


def device_json(device: inventory_pb2.Device, *, driver: str, taints: Sequence[Obj] = ()) -> Obj:
    """One device as in `spec.devices[]`; empty fields are left out, as the API serves them."""
    result: Obj = {"name": device.name}
    attributes = {
        validation.attribute_name(key, driver=driver): attribute_json(device.attributes[key])
        for key in sorted(device.attributes)
    }
    if attributes:
        result["attributes"] = dict(sorted(attributes.items()))
    if device.capacity:
        result["capacity"] = {k: {"value": device.capacity[k]} for k in sorted(device.capacity)}
    if device.consumes_counters:
        result["consumesCounters"] = [
            {
                "counterSet": c.counter_set,
                "counters": {k: {"value": c.counters[k]} for k in sorted(c.counters)},
            }
            for c in device.consumes_counters
        ]
    if taints:
        result["taints"] = [dict(taint) for taint in taints]
    return result


def _counter_set_json(counter_set: inventory_pb2.CounterSet) -> Obj:
    counters = {k: {"value": counter_set.counters[k]} for k in sorted(counter_set.counters)}
    return {"name": counter_set.name, "counters": counters}


_EFFECT_ORDER = {"NoExecute": 0, "NoSchedule": 1, "None": 2}


def _allowed_taints(taints: Sequence[Obj], rules: apirules.PublishRules) -> list[Obj]:
    """The taints the server accepts: known effects only, the strongest first, within the limit."""
    if not rules.taints:
        return []
    kept = [t for t in taints if t.get("effect") in rules.taint_effects]
    kept.sort(key=lambda t: _EFFECT_ORDER.get(str(t.get("effect")), 3))
    return kept[: rules.max_taints]


def _counter_sets(inventory: inventory_pb2.Inventory, rejected: list[Rejection]) -> list[Obj]:
    counter_sets: list[Obj] = []
    for counter_set in sorted(inventory.shared_counters, key=lambda c: c.name):
        if problems := validation.check_counter_set(counter_set):
            rejected.append(Rejection(counter_set.name, tuple(problems)))
        elif any(c["name"] == counter_set.name for c in counter_sets):
            problem = ("duplicate counter set name",)
            rejected.append(Rejection(counter_set.name, problem, layout.DUPLICATE))
        else:
            counter_sets.append(_counter_set_json(counter_set))
    return counter_sets


def _problems(
    device: inventory_pb2.Device,
    *,
    driver: str,
    known_sets: Collection[str],
    rules: apirules.PublishRules,
) -> tuple[list[str], str]:
    """Every reason `device` cannot be published, and the main one (`Rejection.reason`)."""
    problems = validation.check_device(device, driver=driver, counter_sets=known_sets)
    reason = layout.INVALID
    limit = rules.max_counters_per_device
    used = sum(len(c.counters) for c in device.consumes_counters)
    if limit is not None and used > limit:
        reason = layout.INVALID if problems else layout.OVER_LIMIT
        problems.append(f"consumes {used} counters, more than Kubernetes 1.{rules.minor} allows")
    return problems, reason


def _without_counters(device: inventory_pb2.Device) -> inventory_pb2.Device:
    copy = inventory_pb2.Device()
    copy.CopyFrom(device)
    copy.ClearField("consumes_counters")
    return copy


def _with_shared_capacity(
    published: Obj, device: inventory_pb2.Device, rules: apirules.PublishRules
) -> Obj:
    """Publish `device.shared_capacity` as consumable capacity where the server has it."""
    capacity = published.get("capacity", {})
    steps = {name: step for name, step in device.shared_capacity.items() if name in capacity}
    if not steps or not rules.shared_capacity:
        return published  # the plain exclusive device
    for name, step in sorted(steps.items()):
        policy = {"default": step, "validRange": {"min": step, "step": step}}
        capacity[name] = {**capacity[name], "requestPolicy": policy}
    return {**published, "allowMultipleAllocations": True}


def desired(
    inventory: inventory_pb2.Inventory,
    *,
    taints: Mapping[str, Sequence[Obj]] | None = None,
    rules: apirules.PublishRules = NEWEST_RULES,
    taintable: bool = False,
) -> DesiredPool:
    """The pool's desired slices; invalid devices and counter sets are rejected, not fatal.

    `taints`: device -> taints to publish on it. `taintable`: taints may be published on any
    device at any time (lay the pool out for it, so that a taint never moves devices).
    """
    rejected: list[Rejection] = []
    counter_sets = _counter_sets(inventory, rejected) if rules.partitionable else []
    known_sets = {c["name"] for c in counter_sets}
    devices: list[Obj] = []
    withheld: list[str] = []
    for device in sorted(inventory.devices, key=lambda d: d.name):
        if not rules.partitionable:
            if device.parent:
                withheld.append(device.name)
                continue
            device = _without_counters(device)
        problems, reason = _problems(
            device, driver=inventory.driver, known_sets=known_sets, rules=rules
        )
        if any(d["name"] == device.name for d in devices):
            reason = reason if problems else layout.DUPLICATE
            problems.append("duplicate device name in the pool")
        if problems:
            rejected.append(Rejection(device.name, tuple(problems), reason))
            continue
        device_taints = _allowed_taints((taints or {}).get(device.name, ()), rules)
        published = device_json(device, driver=inventory.driver, taints=device_taints)
        if not rules.pci_bus_id:
            published.get("attributes", {}).pop(apirules.PCI_BUS_ID, None)
        devices.append(_with_shared_capacity(published, device, rules))
    contents, unfit = layout.contents(
        devices, counter_sets, rules=rules, taintable=taintable and rules.taints
    )
    return DesiredPool(
        driver=inventory.driver,
        node=inventory.node,
        pool=inventory.pool,
        # An empty pool still gets one empty slice: "no devices" is not "no pool".
        contents=tuple(contents) or ({"devices": []},),
        rejected=tuple(rejected + unfit),
        withheld=tuple(withheld),
    )


def generate_name(node: str, driver: str, *, index: int = 0, count: int = 1) -> str:
    """`<index>-<driver>-<node>-` (v0.36), cut to what the apiserver keeps of a generateName.

    The index is hex, at least 5 digits, wider when the pool has more slices than that.
    """
    width = max(_INDEX_WIDTH, len(f"{max(count - 1, 0):x}"))
    return f"{index:0{width}x}-{driver}-{node}-"[:GENERATE_NAME_MAX]


def slice_index(name: str, *, driver: str) -> int | None:
    """The index prefix of a slice named by `generate_name`, None for any other name."""
    match = _INDEX.match(name)
    if match is None:
        return None
    rest = name[match.end() :]
    expected = f"{driver}-"[: max(GENERATE_NAME_MAX - match.end(), 0)]
    return int(match.group(1), 16) if rest.startswith(expected) else None


def normalize(value: Any) -> Any:
    """Drop empty and null fields, which the API leaves out when it serves an object."""
    if isinstance(value, dict):
        pairs = ((k, normalize(v)) for k, v in value.items())
        return {k: v for k, v in pairs if v is not None and v != {} and v != []}
    if isinstance(value, list):
        return [normalize(v) for v in value]
    return value


def fingerprint(spec: Obj) -> str:
    """A stable text form of a spec (or content), to remember what was sent or stored."""
    return json.dumps(normalize(spec), sort_keys=True, separators=(",", ":"))


def content_of(spec: Obj) -> Content:
    """The slice's own part of a spec: what is left without driver, node and pool."""
    return {k: v for k, v in spec.items() if k not in ("driver", "nodeName", "pool")}


def content_id(content: Content) -> str:
    """A short stable id of a slice's content (devices and counter sets, not the pool)."""
    return hashlib.sha256(fingerprint(content).encode()).hexdigest()[:16]
