"""The resources Huawei's Ascend device plugin offers NPUs as (pure).

`huawei.com/Ascend910` (910A, 910B, A3), `huawei.com/Ascend310P`, `huawei.com/Ascend310` by
chip family; a static vNPU (chip `310Pvir02`) is its template's own resource,
`huawei.com/Ascend310P-2c` (docs/hardware.md §3.6).
"""

from __future__ import annotations

import re

from shared.pb.drasuite.v1 import inventory_pb2
from shared.vendors.parts.plugin_names import PluginNames

__all__ = ["NAMES", "resource_name"]

_TEMPLATE = re.compile(r"vir(\d+)((?:_[a-z0-9]+)*)$")
# npu-smi template suffixes -> the Ascend device plugin's resource suffixes (docs/hardware.md §3.6).
_TEMPLATE_PARTS = {"1c": "1cpu", "3c": "3cpu", "4c": "4cpu", "8g": "8g", "16g": "16g"}
_TEMPLATE_PARTS |= {"32g": "32g", "dvpp": "dvpp", "ndvpp": "ndvpp", "m": "dvpp", "nm": "ndvpp"}


def resource_name(device: inventory_pb2.Device) -> str | None:
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


NAMES = PluginNames(
    kinds=frozenset({"npu"}),
    name=resource_name,
    whole_devices=frozenset(
        {"huawei.com/Ascend910", "huawei.com/Ascend310P", "huawei.com/Ascend310"}
    ),
)
