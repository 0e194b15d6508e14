"""The resources NVIDIA's device plugin offers GPUs and MIG devices as (pure).

`nvidia.com/gpu`; a MIG device that exists (has a UUID) is `nvidia.com/mig-<profile>` (the
device plugin's "mixed" strategy). Placements made only at prepare time are not offered: a
device plugin can only hand out what exists.
"""

from __future__ import annotations

from shared.pb.drasuite.v1 import inventory_pb2
from shared.vendors.parts.plugin_names import PluginNames

__all__ = ["NAMES", "resource_name"]


def resource_name(device: inventory_pb2.Device) -> str | None:
    if device.kind == "gpu":
        return "nvidia.com/gpu"
    profile = device.attributes["profile"].string if "profile" in device.attributes else ""
    if device.kind == "mig" and device.uuid and profile:
        # `+me` (media extensions) is no part of a resource name: NVIDIA's device plugin offers
        # a `1g.10gb+me` device as `mig-1g.10gb`, and so does this front.
        return f"nvidia.com/mig-{profile.partition('+')[0]}"
    return None


NAMES = PluginNames(
    kinds=frozenset({"gpu", "mig"}), name=resource_name, whole_devices=frozenset({"nvidia.com/gpu"})
)
