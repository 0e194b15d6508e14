"""Partition attribution (pure): a parent's fault reaches every partition carved from it.

`topology()` reads the inventory: a device's parent is its `parent` field or else, for a
device consuming a shared counter set, the one device that consumes that whole set (the GPU
of MIG partitions). `attribute()` turns a monitor's view into the view the policy judges: a
partition with a fault of its own keeps it (so it alone is tainted for it); a partition of a
faulty parent gets the parent's fault; a partition of a parent the monitor cannot see is
unknown too; partitions the monitor does not report (NVML sees whole GPUs) are added.
`with_partitions()` names the partitions a device passed through to a VM takes with it.

MIG partitions are placements: the discovery agent names them
`<gpu>-mig-<profile>-<GI profile ID>-<placement start>` (`shared.vendors.nvidia.naming`, as
NVIDIA's driver does, docs/hardware.md 1.3), whether the MIG device exists or is made when a
claim gets it, with `parent` (or the GPU's counter set) naming the GPU.
The GPU-instance ID an NVML event carries is the driver's, given when the instance is made,
so it is in no inventory: the nvml monitor asks NVML for that instance's profile and placement
and finds the partition in `Topology.gpu_instances`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from shared.pb.drasuite.v1 import inventory_pb2
from shared.vendors.nvidia import naming
from shared.vendors.parts.observation import Observation

__all__ = ["Topology", "attribute", "topology", "with_partitions"]

_MAX_DEPTH = 8
_MIG_KIND = "mig"


@dataclass(frozen=True, slots=True)
class Topology:
    devices: tuple[str, ...] = ()
    """Every device of the inventory, in its order."""
    parents: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Partition -> the device it is carved from."""
    gpu_instances: Mapping[tuple[str, int, int], str] = field(
        default_factory=lambda: MappingProxyType({})
    )
    """(GPU, GPU-instance profile ID, placement start) -> the MIG partition there."""


def _owners(inventory: inventory_pb2.Inventory) -> dict[str, str]:
    """Counter set -> the one parentless device that consumes all of it."""
    sets = {s.name: dict(s.counters) for s in inventory.shared_counters}
    found: dict[str, list[str]] = {}
    for device in inventory.devices:
        if device.parent:
            continue
        for use in device.consumes_counters:
            if use.counter_set in sets and dict(use.counters) == sets[use.counter_set]:
                found.setdefault(use.counter_set, []).append(device.name)
    return {name: owners[0] for name, owners in found.items() if len(owners) == 1}


def topology(inventory: inventory_pb2.Inventory | None) -> Topology:
    if inventory is None:
        return Topology()
    names = tuple(d.name for d in inventory.devices)
    known = set(names)
    owners = _owners(inventory)
    parents: dict[str, str] = {}
    for device in inventory.devices:
        if device.parent:
            if device.parent in known and device.parent != device.name:
                parents[device.name] = device.parent
            continue
        for use in device.consumes_counters:
            owner = owners.get(use.counter_set)
            if owner is not None and owner != device.name:
                parents[device.name] = owner
                break
    kinds = {d.name: d.kind for d in inventory.devices}
    instances = {
        (parent, *slot): name
        for name, parent in parents.items()
        if kinds.get(name) == _MIG_KIND and (slot := naming.mig_slot(name, parent)) is not None
    }
    return Topology(
        devices=names,
        parents=MappingProxyType(parents),
        gpu_instances=MappingProxyType(instances),
    )


def _inherited(own: Observation, parent: Observation, parent_name: str) -> Observation:
    if own.unknown or own.fault is not None:
        return own  # its own fault (or blindness) stands
    if parent.unknown:
        return replace(own, unknown=True, fault=parent.fault)
    if parent.fault is None:
        return own
    detail = parent.fault.message or parent.fault.cause
    fault = replace(parent.fault, message=f"parent {parent_name}: {detail}")
    return replace(own, fault=fault)


def attribute(observations: Iterable[Observation], topology: Topology) -> tuple[Observation, ...]:
    """The view with parents' faults carried to their partitions (order: the monitor's, then
    added partitions in inventory order)."""
    seen = {o.device: o for o in observations}
    effective: dict[str, Observation | None] = {}

    def resolve(device: str, depth: int = 0) -> Observation | None:
        if device in effective:
            return effective[device]
        own = seen.get(device)
        parent = topology.parents.get(device)
        result = own
        if parent is not None and depth < _MAX_DEPTH:
            above = resolve(parent, depth + 1)
            if above is not None:
                result = _inherited(own or Observation(device=device), above, parent)
        effective[device] = result
        return result

    ordered = list(seen) + [d for d in topology.devices if d not in seen]
    return tuple(o for o in (resolve(d) for d in ordered) if o is not None)


def with_partitions(devices: Collection[str], topology: Topology) -> frozenset[str]:
    """`devices` and every partition carved from one of them (at any depth): what a device
    passed through to a virtual machine takes with it."""
    found = set(devices)
    for partition in topology.parents:
        above, depth = topology.parents.get(partition), 0
        while above is not None and depth < _MAX_DEPTH:
            if above in devices:
                found.add(partition)
                break
            above, depth = topology.parents.get(above), depth + 1
    return frozenset(found)
