"""MIG slots as partitionable devices over a per-GPU counter set (pure).

One CounterSet per GPU, named `<gpu>-counter-set`, holds the 8 memory slices (one counter
each), the 7 compute slices, and the engines and memory of the largest profile (every counter
is the maximum over the GPU's profiles, as NVIDIA's driver does; zero counters are left out).
The whole GPU consumes all of it; a MIG slot (a profile at one placement) consumes its
profile's share and its own memory slices. So the scheduler cannot hand out a GPU and one of
its slots, nor two slots whose memory slices overlap (docs/hardware.md §1.1, 1.3).

A slot is published one of two ways, under the same name (`naming.mig_name`):

- `partition(..., on_demand=True)`: an option, a MIG device the node's allocation agent makes
  when a claim that got it is prepared (or hands over, when one of its profile already sits
  there). It carries the bool attribute `createdOnDemand: true` and no UUID, before, while and
  after the claim holds it. Upstream (dra-driver-nvidia-gpu, `DynamicMIG`) tells its dynamic
  MIG devices apart only by the missing `uuid`; the explicit flag lets a DeviceClass or claim
  say so.
- `existing(...)`: a MIG device of a profile the node does not offer (an administrator's
  layout, never made or destroyed by a claim), with its `MIG-` UUID (field and `uuid`
  attribute), `NVIDIA_VISIBLE_DEVICES` naming it, and the capability nodes of its GPU and
  compute instance (`naming.gpu_instance_cap`).
"""

from __future__ import annotations

from collections.abc import Sequence

from shared import quantity
from shared.pb.drasuite.v1 import inventory_pb2
from shared.vendors.nvidia import naming
from shared.vendors.nvidia.mig import GpuInstanceProfile, MigDevice, MigProfile, Placement

__all__ = [
    "ON_DEMAND",
    "counter_set",
    "existing",
    "partition",
    "partition_name",
    "whole_device_consumption",
]

ON_DEMAND = "createdOnDemand"
"""Bool attribute of a partition made when a claim is prepared (not one that exists now)."""
_STRIPPED_ATTRIBUTES = ("uuid", "index", "migCapable")


def partition_name(gpu: str, profile: MigProfile, placement: Placement) -> str:
    """`gpu-0-mig-1g10gb-me-20-3`: profile without dots, lower-case, RFC 1123 (as upstream)."""
    return naming.mig_name(gpu, profile.name, profile.info.id, placement.start)


def _engines(info: GpuInstanceProfile) -> dict[str, int]:
    return {
        "compute-slices": info.slice_count,
        "multiprocessors": info.multiprocessors,
        "copy-engines": info.copy_engines,
        "decoders": info.decoders,
        "encoders": info.encoders,
        "jpeg-engines": info.jpeg_engines,
        "ofa-engines": info.ofa_engines,
        "memory": info.memory_mib,
    }


def _render(values: dict[str, int]) -> dict[str, str]:
    rendered = {}
    for name, value in values.items():
        if value > 0:
            rendered[name] = quantity.mebibytes(value) if name == "memory" else str(value)
    return rendered


def _memory_slices(profiles: Sequence[MigProfile]) -> int:
    return max((p.end for m in profiles for p in m.placements), default=0)


def counter_set(gpu: str, profiles: Sequence[MigProfile]) -> inventory_pb2.CounterSet:
    """The GPU's counters: the maximum of every engine count, and one counter per memory slice."""
    maxima: dict[str, int] = {}
    for profile in profiles:
        for name, value in _engines(profile.info).items():
            maxima[name] = max(maxima.get(name, 0), value)
    counters = _render(maxima)
    counters.update({f"memory-slice-{i}": "1" for i in range(_memory_slices(profiles))})
    return inventory_pb2.CounterSet(name=naming.counter_set_name(gpu), counters=counters)


def whole_device_consumption(
    counters: inventory_pb2.CounterSet,
) -> inventory_pb2.CounterConsumption:
    """The whole GPU uses every counter of its set."""
    return inventory_pb2.CounterConsumption(
        counter_set=counters.name, counters=dict(counters.counters)
    )


def partition(
    parent: inventory_pb2.Device,
    profile: MigProfile,
    placement: Placement,
    *,
    counters: inventory_pb2.CounterSet,
    on_demand: bool = False,
) -> inventory_pb2.Device:
    """One MIG placement of `parent` as a device consuming from the parent's counter set.

    `on_demand`: the placement is made at prepare time (flagged with `ON_DEMAND`).
    """
    info = profile.info
    device = inventory_pb2.Device(
        name=partition_name(parent.name, profile, placement),
        kind="mig",
        parent=parent.name,
        device_nodes=list(parent.device_nodes),
        capacity={
            "memory": quantity.mebibytes(info.memory_mib),
            "multiprocessors": str(info.multiprocessors),
            "copyEngines": str(info.copy_engines),
            "decoders": str(info.decoders),
            "encoders": str(info.encoders),
            "jpegEngines": str(info.jpeg_engines),
            "ofaEngines": str(info.ofa_engines),
        },
    )
    for key, value in parent.attributes.items():
        if key not in _STRIPPED_ATTRIBUTES:
            device.attributes[key].CopyFrom(value)
    device.attributes["type"].string = "mig"
    device.attributes["profile"].string = profile.name
    device.attributes["parentUUID"].string = parent.uuid
    device.attributes["placementStart"].int = placement.start
    if on_demand:
        device.attributes[ON_DEMAND].bool = True
    used = _render(_engines(info))
    used.update({f"memory-slice-{i}": "1" for i in range(placement.start, placement.end)})
    device.consumes_counters.append(
        inventory_pb2.CounterConsumption(counter_set=counters.name, counters=used)
    )
    return device


def existing(
    parent: inventory_pb2.Device,
    profile: MigProfile,
    placement: Placement,
    mig: MigDevice,
    *,
    gpu_minor: int,
    counters: inventory_pb2.CounterSet,
) -> inventory_pb2.Device:
    """The MIG device `mig` that exists at `placement` of `parent` (GPU `/dev/nvidia<minor>`):
    its slot's device with its UUID, its own visible-devices value and its capability nodes."""
    device = partition(parent, profile, placement, counters=counters)
    uuid = naming.mig_uuid(mig.uuid)
    device.uuid = uuid
    device.attributes["uuid"].string = uuid
    device.env["NVIDIA_VISIBLE_DEVICES"] = uuid
    gi = naming.gpu_instance_cap(gpu_minor, mig.gpu_instance)
    ci = naming.compute_instance_cap(gpu_minor, mig.gpu_instance, mig.compute_instance)
    for minor in (gi, ci):
        device.device_nodes.add(path=naming.caps_node(minor))
    return device
