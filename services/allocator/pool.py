"""Resource pools as kube-scheduler gathers them from ResourceSlices (pure).

A pool is the slices of one driver and pool name. Only its newest `spec.pool.generation`
counts: older slices are outdated. The pool is incomplete while fewer (or more) slices of that
generation exist than its `resourceSliceCount` says: its devices are not allocated, and a
request for `All` devices fails. It is invalid when two of its slices publish the same device
name, or its shared counters do not add up (see `counters`). A node sees the slices with its
`nodeName`, those for `allNodes`, and those whose node selector names it by
`metadata.name` (with `perDeviceNodeSelection`, the same per device); within a pool, slices
are tried in name order, as the 1.36 scheduler does.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from services.allocator.counters import Counters
from services.allocator.device import Device

__all__ = ["Inventory", "Pool", "PoolKey", "current_slices"]

Obj = dict[str, Any]
PoolKey = tuple[str, str]
"""(driver, pool name)."""


def _pool_key(item: Obj) -> PoolKey:
    spec = item["spec"]
    return (spec["driver"], spec["pool"]["name"])


def _generation(item: Obj) -> int:
    return int(item["spec"]["pool"].get("generation") or 0)


def current_slices(slices: Sequence[Obj]) -> list[Obj]:
    """The slices of each pool's newest generation, in the order given."""
    newest: dict[PoolKey, int] = {}
    for item in slices:
        pool = _pool_key(item)
        newest[pool] = max(newest.get(pool, _generation(item)), _generation(item))
    return [item for item in slices if _generation(item) == newest[_pool_key(item)]]


@dataclass(frozen=True, slots=True)
class Pool:
    driver: str
    name: str
    generation: int
    devices: tuple[Device, ...]
    """The devices this node sees, in slice-name then device order."""
    incomplete: str = ""
    """Why the pool is incomplete ("" when it is complete)."""
    invalid: str = ""
    """Why the pool is invalid ("" when it is valid)."""

    @property
    def key(self) -> PoolKey:
        return (self.driver, self.name)

    @property
    def usable(self) -> bool:
        return not self.incomplete and not self.invalid


@dataclass(slots=True)
class _PoolData:
    generation: int
    slices: list[Obj] = field(default_factory=list)


def _targets(spec: Obj) -> tuple[str | None, bool]:
    """(node name or None, for every node) of a slice (or of a device, with per-device node
    selection); a node selector naming exactly one node by `metadata.name` counts as that
    node, one by labels as none (node labels are not read)."""
    if spec.get("nodeName"):
        return str(spec["nodeName"]), False
    if spec.get("allNodes"):
        return None, True
    for term in (spec.get("nodeSelector") or {}).get("nodeSelectorTerms") or []:
        for field_ in term.get("matchFields") or []:
            if field_.get("key") == "metadata.name" and field_.get("operator") == "In":
                values = field_.get("values") or []
                if len(values) == 1:
                    return str(values[0]), False
    return None, False


def _slice_targets(spec: Obj) -> set[tuple[str | None, bool]]:
    """Where a slice's devices go: the slice's target, or each device's with
    `perDeviceNodeSelection`."""
    if spec.get("perDeviceNodeSelection"):
        return {_targets(device) for device in spec.get("devices") or []}
    return {_targets(spec)}


class Inventory:
    """Every pool of a set of slices, indexed by the node its slices target."""

    def __init__(self, slices: Iterable[Obj]) -> None:
        pools: dict[PoolKey, _PoolData] = {}
        for item in slices:
            key, generation = _pool_key(item), _generation(item)
            data = pools.get(key)
            if data is None or generation > data.generation:
                pools[key] = data = _PoolData(generation)
            if generation == data.generation:
                data.slices.append(item)
        self.counters = Counters([s for d in pools.values() for s in d.slices])
        self._pools: dict[PoolKey, _PoolData] = pools
        self._by_node: dict[str | None, list[PoolKey]] = defaultdict(list)
        self._everywhere: list[PoolKey] = []
        for key, data in sorted(pools.items()):
            nodes = {target for s in data.slices for target in _slice_targets(s["spec"])}
            if any(every for _, every in nodes):
                self._everywhere.append(key)
            for node in sorted({n for n, _ in nodes if n is not None}):
                self._by_node[node].append(key)
        self._cache: dict[str | None, list[Pool]] = {}

    @property
    def nodes(self) -> list[str]:
        """The nodes some slice targets by name, sorted."""
        return sorted(n for n in self._by_node if n is not None)

    def pools(self, node: str | None) -> list[Pool]:
        """The pools the node sees, sorted by driver and pool name; with None, every pool
        with all its devices (the slices given are one node's)."""
        cached = self._cache.get(node)
        if cached is None:
            if node is None:
                keys = sorted(self._pools)
            else:
                keys = sorted({*self._by_node.get(node, ()), *self._everywhere})
            cached = self._cache[node] = [self._pool(key, node) for key in keys]
        return cached

    def _pool(self, key: PoolKey, node: str | None) -> Pool:
        data = self._pools[key]
        devices: list[Device] = []
        seen: set[str] = set()
        duplicate = ""
        for item in sorted(data.slices, key=lambda s: s["metadata"].get("name", "")):
            spec = item["spec"]
            per_device = bool(spec.get("perDeviceNodeSelection"))
            target, every = _targets(spec)
            for raw in spec.get("devices") or []:
                if raw["name"] in seen:
                    duplicate = duplicate or f"duplicate device name {raw['name']}"
                seen.add(raw["name"])
                if per_device:
                    target, every = _targets(raw)
                if node is None or every or target == node:
                    name = item["metadata"].get("name", "")
                    devices.append(
                        Device.from_json(raw, driver=key[0], pool=key[1], slice_name=name)
                    )
        return Pool(
            driver=key[0],
            name=key[1],
            generation=data.generation,
            devices=tuple(devices),
            incomplete=self._incompleteness(data),
            invalid=duplicate or self.counters.problem(*key),
        )

    @staticmethod
    def _incompleteness(data: _PoolData) -> str:
        counts = {s["spec"]["pool"].get("resourceSliceCount") for s in data.slices}
        counts.discard(None)  # not set: nothing to compare with
        if not counts:
            return ""
        expected = max(int(c) for c in counts)
        if len(data.slices) != expected:
            return (
                f"{len(data.slices)} of {expected} slices of generation {data.generation} "
                "are published"
            )
        return ""

    def devices(self) -> list[Device]:
        """Every device of every pool's newest generation, in slice-name order."""
        items = [s for d in self._pools.values() for s in d.slices]
        return [
            Device.from_json(raw, driver=s["spec"]["driver"], pool=s["spec"]["pool"]["name"])
            for s in sorted(items, key=lambda s: s["metadata"].get("name", ""))
            for raw in s["spec"].get("devices") or []
        ]
