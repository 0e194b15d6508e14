"""Which devices to prefer for an allocation of N: the topology preference (pure).

The order of docs/hardware.md §4: chips on one card first (both chips of a 310P Duo, both dies of
an A3 NPU), else chips of one HCCS ring (or, for GPUs, one NVLink group), else chips across
PCIe, NUMA-aligned where one NUMA node can hold them all. Among groups that fit, the one with
the fewest free devices wins (best fit, as Volcano's ring affinity does), so that whole cards
and rings stay free for larger requests. The answer depends only on the arguments (ties go
to the earlier device in inventory order) and always holds the devices it must include.

Devices without a card are each a card of their own; without a ring, a ring of their own;
without a NUMA node, all on one unknown node. No I/O; the device-plugin servicer calls this
for `GetPreferredAllocation`, and the same order is what the DRA example claim asks for.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from shared.pb.drasuite.v1 import inventory_pb2

__all__ = ["Placement", "PreferenceError", "placement_of", "preferred"]

_CARD_ATTRIBUTE = "cardId"
_RING_ATTRIBUTES = ("topologyGroup", "interconnectGroup")
_NUMA_ATTRIBUTE = "numaNode"


class PreferenceError(ValueError):
    """A request no allocation can satisfy (size out of range, unknown devices)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """Where a device sits: its card, its ring (HCCS ring or NVLink group), its NUMA node."""

    device: str
    card: str | None = None
    ring: str | None = None
    numa: int | None = None


def placement_of(device: inventory_pb2.Device) -> Placement:
    """A device's placement from its published attributes (`cardId`, `topologyGroup` or
    `interconnectGroup`, `numaNode`)."""
    attributes = device.attributes
    card = str(attributes[_CARD_ATTRIBUTE].int) if _CARD_ATTRIBUTE in attributes else None
    ring = next((attributes[a].string for a in _RING_ATTRIBUTES if a in attributes), None)
    numa = attributes[_NUMA_ATTRIBUTE].int if _NUMA_ATTRIBUTE in attributes else None
    return Placement(device=device.name, card=card, ring=ring or None, numa=numa)


_Key = Callable[[Placement], Hashable]


def _card(p: Placement) -> Hashable:
    return ("card", p.card) if p.card is not None else ("device", p.device)


def _ring(p: Placement) -> Hashable:
    return ("ring", p.ring) if p.ring is not None else ("device", p.device)


def _numa(p: Placement) -> Hashable:
    return p.numa


def _ring_on_numa(p: Placement) -> Hashable:
    return (_ring(p), p.numa)


# Groups a whole allocation may fit in, tightest first.
_FIT_LEVELS: tuple[_Key, ...] = (_card, _ring_on_numa, _ring, _numa)
# How an allocation that spans groups is packed, coarsest first.
_PACK_LEVELS: tuple[_Key, ...] = (_numa, _ring, _card)


def preferred(
    placements: Sequence[Placement],
    *,
    available: Iterable[str],
    must_include: Iterable[str] = (),
    size: int,
) -> list[str]:
    """`size` device names out of `available`, `must_include` among them, in inventory order.

    `placements` lists every device the answer may name, in inventory order; PreferenceError
    when a name is unknown, `must_include` is not available or `size` does not fit.
    """
    order = {p.device: k for k, p in enumerate(placements)}
    by_name = {p.device: p for p in placements}
    free_names = _known(available, by_name, what="available")
    must_names = _known(must_include, by_name, what="must-include")
    if not set(must_names) <= set(free_names):
        raise PreferenceError("must-include devices must be available")
    if not len(must_names) <= size <= len(free_names):
        raise PreferenceError(
            f"allocation size {size} must lie between {len(must_names)} (must-include) and "
            f"{len(free_names)} (available)"
        )
    must = [by_name[n] for n in must_names]
    free = sorted((by_name[n] for n in free_names if n not in set(must_names)), key=_by(order))
    chosen = must + _choose(free, must, size - len(must), order)
    return sorted((p.device for p in chosen), key=order.__getitem__)


def _known(names: Iterable[str], by_name: Mapping[str, Placement], *, what: str) -> list[str]:
    unique = list(dict.fromkeys(names))
    unknown = [n for n in unique if n not in by_name]
    if unknown:
        raise PreferenceError(f"{what} devices {unknown[:8]} are not devices of this resource")
    return unique


def _by(order: Mapping[str, int]) -> Callable[[Placement], int]:
    return lambda p: order[p.device]


def _choose(
    free: list[Placement], must: list[Placement], k: int, order: Mapping[str, int]
) -> list[Placement]:
    if k == 0:
        return []
    for level, key in enumerate(_FIT_LEVELS):
        must_keys = {key(p) for p in must}
        if len(must_keys) > 1:
            continue  # what must be included already spans more than one such group
        groups = _groups(free, key)
        fitting = [
            members
            for group, members in groups.items()
            if len(members) >= k and (not must_keys or group in must_keys)
        ]
        if fitting:
            fit = _fit(free, _FIT_LEVELS[level + 1 :], order)
            return _pack(min(fitting, key=fit), must, k, order, _PACK_LEVELS)
    return _grow(free, must, k, order)


def _fit(
    free: list[Placement], coarser: Sequence[_Key], order: Mapping[str, int]
) -> Callable[[list[Placement]], tuple[int, ...]]:
    """Best fit: the group with the fewest free devices, then the one whose ring and NUMA node
    have the fewest (a lone free chip is taken before one of a free pair), then the first."""
    sizes = [
        {group: len(members) for group, members in _groups(free, key).items()} for key in coarser
    ]

    def rank(members: list[Placement]) -> tuple[int, ...]:
        first = members[0]
        enclosing = [size[key(first)] for size, key in zip(sizes, coarser, strict=True)]
        return (len(members), *enclosing, order[first.device])

    return rank


def _grow(
    free: list[Placement], must: list[Placement], k: int, order: Mapping[str, int]
) -> list[Placement]:
    """No single group holds it all: fill the cards, then rings, then NUMA nodes of what is
    already chosen, tightest first; the rest spans as few groups as possible."""
    taken: list[Placement] = []
    for key in _FIT_LEVELS:
        anchors = {key(p) for p in [*must, *taken]}
        near = [p for p in free if p not in taken and key(p) in anchors]
        if len(near) >= k - len(taken):
            return taken + _pack(near, [*must, *taken], k - len(taken), order, _PACK_LEVELS)
        taken += near
    rest = [p for p in free if p not in taken]
    return taken + _pack(rest, [*must, *taken], k - len(taken), order, _PACK_LEVELS)


def _groups(devices: Iterable[Placement], key: _Key) -> dict[Hashable, list[Placement]]:
    groups: dict[Hashable, list[Placement]] = {}
    for device in devices:
        groups.setdefault(key(device), []).append(device)
    return groups


def _pack(
    free: list[Placement],
    must: list[Placement],
    k: int,
    order: Mapping[str, int],
    levels: Sequence[_Key],
) -> list[Placement]:
    """`k` of `free` spanning as few groups as possible, level by level, near `must` first."""
    if not levels:
        return free[:k]
    key, finer = levels[0], levels[1:]
    must_keys = {key(p) for p in must}
    groups = list(_groups(free, key).values())
    picked: list[Placement] = []
    while k > 0:
        # With the groups `must` lives in first: a group that holds the rest (best fit),
        # else the largest one whole, and go on.
        fitting = [g for g in groups if len(g) >= k]
        if fitting:
            best = min(
                fitting, key=lambda g: (key(g[0]) not in must_keys, len(g), order[g[0].device])
            )
            return picked + _pack(best, must, k, order, finer)
        largest = min(
            groups, key=lambda g: (key(g[0]) not in must_keys, -len(g), order[g[0].device])
        )
        groups.remove(largest)
        picked += largest
        k -= len(largest)
    return picked
