"""Which extended resource each inventory device is offered as on the device-plugin front (pure).

One resource per device kind, named as the vendors' device plugins name them, so that pod
specs written for those plugins keep working: each vendor package's `plugin_names` says which
kinds it names and how (`Vendor.plugin_names`; `huawei.com/Ascend910`, `nvidia.com/gpu`,
`nvidia.com/mig-<profile>`...). Any other kind, and every sim device, is `<driver>/<kind>`
(`sim.dra-suite.io/npu`, `sim.dra-suite.io/gpu`).

`overrides` (kind or default name -> resource name, from configuration, parsed by
resource_names.py) replace any of these.
A device ID is the inventory device name (a DNS label, within the kubelet's 63 characters).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from services.allocation.resource_names import RESOURCE_NAME
from shared.pb.drasuite.v1 import inventory_pb2
from shared.vendors import registry
from shared.vendors.parts.partitions import ON_DEMAND

__all__ = [
    "Resource",
    "resource_name",
    "resources",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Resource:
    """One extended resource and its devices, in inventory order."""

    name: str
    devices: tuple[inventory_pb2.Device, ...]

    def device(self, device_id: str) -> inventory_pb2.Device | None:
        return next((d for d in self.devices if d.name == device_id), None)


def resource_name(
    device: inventory_pb2.Device, *, backend: str, driver: str, overrides: Mapping[str, str]
) -> str | None:
    """The resource `device` is offered as, or None when it is not offered."""
    if device.attributes[ON_DEMAND].bool if ON_DEMAND in device.attributes else False:
        return None
    names = registry.BACKENDS[backend].plugin_names
    if device.kind in names.kinds:
        name = names.name(device)
    elif device.parent:
        name = None  # a partition of a backend without static partitions
    else:
        name = f"{driver}/{device.kind or 'device'}"
    if name is None:
        return None
    if name in overrides:
        return overrides[name]
    # A kind's override renames its whole devices, never its partitions' own resources.
    whole = name in names.whole_devices or name == f"{driver}/{device.kind or 'device'}"
    return overrides.get(device.kind, name) if whole else name


def resources(
    inventory: inventory_pb2.Inventory | None,
    *,
    driver: str,
    backend: str,
    overrides: Mapping[str, str],
) -> dict[str, Resource]:
    """Every resource the inventory offers, by name, devices in inventory order; `backend` is
    the node's own, never the inventory's."""
    if inventory is None:
        return {}
    grouped: dict[str, list[inventory_pb2.Device]] = {}
    for device in inventory.devices:
        name = resource_name(device, backend=backend, driver=driver, overrides=overrides)
        if name is not None and RESOURCE_NAME.match(name):
            grouped.setdefault(name, []).append(device)
    return {name: Resource(name=name, devices=tuple(found)) for name, found in grouped.items()}
