"""Which extended resource each inventory device is offered as on the device-plugin front (pure).

One resource per device kind, named as the vendors' device plugins name them, so that pod
specs written for those plugins keep working:

- `ascend` NPUs: `huawei.com/Ascend910` (910A, 910B, A3), `huawei.com/Ascend310P`,
  `huawei.com/Ascend310` by chip family; a static vNPU (chip `310Pvir02`) is its template's
  own resource, `huawei.com/Ascend310P-2c` (docs/hardware.md §3.6).
- `nvml`: `nvidia.com/gpu`; a MIG device that exists (has a UUID) is `nvidia.com/mig-<profile>`
  (the device plugin's "mixed" strategy). Placements made only at prepare time are not
  offered: a device plugin can only hand out what exists.
- `sim` and anything else: `<driver>/<kind>` (`sim.dra-suite.io/npu`, `sim.dra-suite.io/gpu`).

`overrides` (kind or default name -> resource name, from configuration, parsed by
resource_names.py) replace any of these.
A device ID is the inventory device name (a DNS label, within the kubelet's 63 characters).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from services.allocation.resource_names import RESOURCE_NAME
from shared.pb.drasuite.v1 import inventory_pb2

__all__ = [
    "VENDOR_NAMES",
    "Resource",
    "resource_name",
    "resources",
]

_ON_DEMAND = "createdOnDemand"
_TEMPLATE = re.compile(r"vir(\d+)((?:_[a-z0-9]+)*)$")
# npu-smi template suffixes -> the Ascend device plugin's resource suffixes (docs/hardware.md §3.6).
_TEMPLATE_PARTS = {"1c": "1cpu", "3c": "3cpu", "4c": "4cpu", "8g": "8g", "16g": "16g"}
_WHOLE_DEVICE_NAMES = frozenset(
    {"huawei.com/Ascend910", "huawei.com/Ascend310P", "huawei.com/Ascend310", "nvidia.com/gpu"}
)
_TEMPLATE_PARTS |= {"32g": "32g", "dvpp": "dvpp", "ndvpp": "ndvpp", "m": "dvpp", "nm": "ndvpp"}


@dataclass(frozen=True, slots=True, kw_only=True)
class Resource:
    """One extended resource and its devices, in inventory order."""

    name: str
    devices: tuple[inventory_pb2.Device, ...]

    def device(self, device_id: str) -> inventory_pb2.Device | None:
        return next((d for d in self.devices if d.name == device_id), None)


def _ascend(device: inventory_pb2.Device) -> str | None:
    chip = device.attributes["chipName"].string if "chipName" in device.attributes else ""
    chip = chip.removeprefix("Ascend").strip()
    family = (
        "Ascend310P"
        if chip.startswith("310P")
        else "Ascend310"
        if chip.startswith("310")
        else "Ascend910"
    )
    template = _TEMPLATE.search(chip)
    if template is None:
        return f"huawei.com/{family}"
    parts = [f"{int(template.group(1))}c"]
    for part in filter(None, template.group(2).split("_")):
        if part not in _TEMPLATE_PARTS:
            return None  # a template this table does not know: not offered rather than misnamed
        parts.append(_TEMPLATE_PARTS[part])
    return f"huawei.com/{family}-{'.'.join(parts)}"


def _nvidia(device: inventory_pb2.Device) -> str | None:
    if device.kind == "gpu":
        return "nvidia.com/gpu"
    profile = device.attributes["profile"].string if "profile" in device.attributes else ""
    if device.kind == "mig" and device.uuid and profile:
        # `+me` (media extensions) is no part of a resource name: NVIDIA's device plugin offers
        # a `1g.10gb+me` device as `mig-1g.10gb`, and so does this front.
        return f"nvidia.com/mig-{profile.partition('+')[0]}"
    return None


def _none(_: inventory_pb2.Device) -> str | None:
    return None


VENDOR_NAMES: Mapping[str, tuple[frozenset[str], Callable[[inventory_pb2.Device], str | None]]] = {
    "sim": (frozenset(), _none),
    "nvml": (frozenset({"gpu", "mig"}), _nvidia),
    "ascend": (frozenset({"npu"}), _ascend),
}
"""Per backend: the device kinds named as the vendor's device plugin names them, and how."""


def resource_name(
    device: inventory_pb2.Device, *, backend: str, driver: str, overrides: Mapping[str, str]
) -> str | None:
    """The resource `device` is offered as, or None when it is not offered."""
    if device.attributes[_ON_DEMAND].bool if _ON_DEMAND in device.attributes else False:
        return None
    kinds, vendor_name = VENDOR_NAMES[backend]
    if device.kind in kinds:
        name = vendor_name(device)
    elif device.parent:
        name = None  # a partition of a backend without static partitions
    else:
        name = f"{driver}/{device.kind or 'device'}"
    if name is None:
        return None
    if name in overrides:
        return overrides[name]
    # A kind's override renames its whole devices, never its partitions' own resources.
    whole = name in _WHOLE_DEVICE_NAMES or name == f"{driver}/{device.kind or 'device'}"
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
