"""How a pool's devices and shared counter sets are laid out over slices (pure).

1.35+: counter sets in slices of their own (at most 8 per slice), devices in order in chunks
of 128 (64 once a device has taints or consumes counters; always 64 with `taintable`, when
taints may come and go, so that a taint never moves devices to other slices). 1.34: a
counter set sits in the same slice as every device that consumes it; sets linked by a
device consuming from both travel together. Such groups are packed in order into slices
within the 1.34 per-slice limits; a group too big for one slice is rejected whole (never
half-published), and devices that consume no counters get slices of their own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from services.discovery.apirules import PublishRules

__all__ = [
    "DUPLICATE",
    "INVALID",
    "MAX_COUNTER_SETS",
    "MAX_DEVICES",
    "MAX_DEVICES_ADVANCED",
    "OVER_LIMIT",
    "Rejection",
    "contents",
    "counter_uses",
    "split",
]

MAX_DEVICES = 128
MAX_DEVICES_ADVANCED = 64
MAX_COUNTER_SETS = 8
# Why a device or counter set is left out (`Rejection.reason`, a metric label: few values).
INVALID = "invalid"
"""It breaks a field rule of the API (a name, an attribute value too long, ...)."""
DUPLICATE = "duplicate"
OVER_LIMIT = "over_limit"
"""It breaks a size limit of the server's version (counters per device or per slice)."""

Obj = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Rejection:
    """A device (or counter set) left out of the slices, and why."""

    name: str
    problems: tuple[str, ...]
    reason: str = INVALID
    """`INVALID`, `DUPLICATE` or `OVER_LIMIT`."""


def _advanced(device: Obj) -> bool:
    return bool(device.get("taints") or device.get("consumesCounters"))


def split(devices: Sequence[Obj], *, taintable: bool = False) -> list[list[Obj]]:
    """Devices in order, in chunks within the per-slice limits; never an empty chunk.

    `taintable`: any device may get taints at any time, so every chunk keeps to the lower
    limit and a taint added or removed changes one slice, not the layout.
    """
    chunks: list[list[Obj]] = []
    current: list[Obj] = []
    advanced = taintable
    for device in devices:
        grown_advanced = advanced or _advanced(device)
        limit = MAX_DEVICES_ADVANCED if grown_advanced else MAX_DEVICES
        if current and len(current) + 1 > limit:
            chunks.append(current)
            current, grown_advanced = [], taintable or _advanced(device)
        current.append(device)
        advanced = grown_advanced
    if current:
        chunks.append(current)
    return chunks


def counter_uses(device: Obj) -> int:
    """How many counters `device` consumes, over all its counter sets."""
    return sum(len(c.get("counters") or {}) for c in device.get("consumesCounters") or [])


def contents(
    devices: Sequence[Obj],
    counter_sets: Sequence[Obj],
    *,
    rules: PublishRules,
    taintable: bool = False,
) -> tuple[list[Obj], list[Rejection]]:
    """The slice contents (`{"devices": ...}` / `{"sharedCounters": ...}`) and what did not fit.

    `taintable`: devices may get taints later (see `split`).
    """
    if not rules.counters_with_devices:
        separate: list[Obj] = [
            {"sharedCounters": list(counter_sets[i : i + MAX_COUNTER_SETS])}
            for i in range(0, len(counter_sets), MAX_COUNTER_SETS)
        ]
        chunks = split(devices, taintable=taintable)
        return separate + [{"devices": chunk} for chunk in chunks], []
    return _together(devices, counter_sets, rules, taintable=taintable)


@dataclass(slots=True)
class _Group:
    """Counter sets linked by their consumers, and those consumers."""

    sets: list[Obj] = field(default_factory=list)
    devices: list[Obj] = field(default_factory=list)

    @property
    def counters(self) -> int:
        return sum(len(s.get("counters") or {}) for s in self.sets)

    @property
    def uses(self) -> int:
        return sum(map(counter_uses, self.devices))


def _groups(devices: Sequence[Obj], counter_sets: Sequence[Obj]) -> tuple[list[_Group], list[Obj]]:
    """Groups in the order of their first counter set, and the devices consuming nothing."""
    root = {s["name"]: s["name"] for s in counter_sets}

    def find(name: str) -> str:
        while root[name] != name:
            root[name] = root[root[name]]
            name = root[name]
        return name

    plain: list[Obj] = []
    for device in devices:
        names = [c["counterSet"] for c in device.get("consumesCounters") or []]
        if not names:
            plain.append(device)
        for other in names[1:]:
            root[find(other)] = find(names[0])
    groups: dict[str, _Group] = {}
    for counter_set in counter_sets:
        groups.setdefault(find(counter_set["name"]), _Group()).sets.append(counter_set)
    for device in devices:
        if consumed := device.get("consumesCounters"):
            groups[find(consumed[0]["counterSet"])].devices.append(device)
    return list(groups.values()), plain


def _too_big(group: _Group, rules: PublishRules) -> str:
    limits = (
        (group.counters, rules.max_counters_per_slice, "shared counters"),
        (len(group.devices), MAX_DEVICES_ADVANCED, "devices"),
        (group.uses, rules.max_counter_uses_per_slice, "counters consumed by its devices"),
    )
    for value, limit, what in limits:
        if limit is not None and value > limit:
            allowed = f"Kubernetes 1.{rules.minor} allows {limit}"
            return f"{value} {what} in one slice, more than {allowed}"
    return ""


def _fits(slice_: _Group, group: _Group, rules: PublishRules) -> bool:
    merged = _Group(slice_.sets + group.sets, slice_.devices + group.devices)
    return not _too_big(merged, rules)


def _together(
    devices: Sequence[Obj], counter_sets: Sequence[Obj], rules: PublishRules, *, taintable: bool
) -> tuple[list[Obj], list[Rejection]]:
    groups, plain = _groups(devices, counter_sets)
    rejected: list[Rejection] = []
    packed: list[_Group] = []
    for group in groups:
        if reason := _too_big(group, rules):
            names = [s["name"] for s in group.sets]
            problem = f"counter sets {names} and their consumers: {reason}"
            rejected += [
                Rejection(o["name"], (problem,), OVER_LIMIT) for o in group.sets + group.devices
            ]
        elif packed and _fits(packed[-1], group, rules):
            packed[-1] = _Group(packed[-1].sets + group.sets, packed[-1].devices + group.devices)
        else:
            packed.append(group)
    result: list[Obj] = [
        {"sharedCounters": g.sets, "devices": sorted(g.devices, key=lambda d: str(d["name"]))}
        for g in packed
    ]
    return result + [{"devices": chunk} for chunk in split(plain, taintable=taintable)], rejected
