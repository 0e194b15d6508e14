"""The Ascend device model (pure): device names, AI cores, vNPU templates and their counters.

Names: discovery publishes a chip as `npu-<device id>` (docs/hardware.md §3.1: the `Device`
column on 310/310P, `Phy-ID` on A3, else the NPU id) and the ResourceSlices are the contract,
so the health monitor names every chip it watches with `device_name` too, and a fault lands on
the device the scheduler knows. A static vNPU of a chip is `npu-<device id>-vnpu-<vNPU id>`
(vNPU ids are unique on the node, docs/hardware.md §3.6).

Counters (docs/hardware.md §3.6): a chip and its vNPUs cannot be used at once, and a chip's
vNPUs share its AI cores. A chip with static vNPUs gets one counter set,
`npu-<device id>-counter-set`, holding its AI cores (`ai-cores`); the whole chip consumes all
of it and each vNPU its template's cores (`vir<NN>...` has NN), so the scheduler never
allocates a chip together with a vNPU of it. A vNPU made at prepare time is made on a whole
chip that a claim was allocated, which holds the whole counter set the same way.

Templates made at prepare (`TEMPLATES`, docs/hardware.md §3.6): a chip whose model has
templates, and whose npu-smi shows its vNPU view, is published with options: per template,
as many as its AI cores hold, each `npu-<device id>-vnpu-<template>-<k>` consuming the
template's cores of the chip's counter set. The allocation agent makes such a vNPU under an
id of the chip's upper half (`on_demand_ids`) and destroys it at unprepare, so discovery tells
those vNPUs from an administrator's by id alone and publishes them as nothing of their own:
the option the claim was allocated stands for its vNPU for its whole life.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

from shared.vendors.ascend.npusmi import NpuChip, NpuSmiError

__all__ = [
    "AI_CORES",
    "AI_CORE_COUNTER",
    "TEMPLATE",
    "ai_cores",
    "counter_set_name",
    "counter_total",
    "device_name",
    "device_names",
    "on_demand_ids",
    "option_name",
    "template_cores",
    "templates",
    "vnpu_consumption",
    "vnpu_ids",
    "vnpu_name",
    "whole_chip_consumption",
]

AI_CORES = {
    "910A": 30,
    "910B1": 24,
    "910B2": 24,
    "910B3": 20,
    "910B4": 20,
    "910B4-1": 20,
    "Ascend910": 20,
    "310P3": 8,
}
"""AI cores per chip (docs/hardware.md §3.1); A3 (`Ascend910`) per die."""
TEMPLATES: Mapping[str, tuple[str, ...]] = {
    "910B1": ("vir03_1c_8g", "vir06_1c_16g", "vir12_3c_32g"),
    "910B2": ("vir03_1c_8g", "vir06_1c_16g", "vir12_3c_32g"),
    "910B3": ("vir05_1c_16g", "vir10_3c_32g"),
    "910B4-1": ("vir05_1c_16g", "vir10_3c_32g"),
    "910B4": ("vir05_1c_8g", "vir10_3c_16g"),
    "310P3": (
        "vir01",
        "vir02",
        "vir04",
        "vir02_1c",
        "vir04_3c",
        "vir04_3c_ndvpp",
        "vir04_4c_dvpp",
    ),
}
"""The vNPU templates made at prepare, per chip model (docs/hardware.md §3.6)."""
VNPU_IDS = 16
"""vNPU ids per chip: `[phy*16+100, phy*16+115]` (docs/hardware.md §3.6)."""
_INFERENCE_IDS = 8
"""Inference chips (310P) use only the first 8 of them."""
AI_CORE_COUNTER = "ai-cores"
"""The counter of a chip's AI cores, which its vNPUs share."""
TEMPLATE = re.compile(r"^vir(\d+)(_[a-z0-9]+)*$")
"""A vNPU template name (`vir01`, `vir05_1c_8g`): `vir` and its AI cores, then options."""
_IN_CHIP_NAME = re.compile(r"vir(\d+)")


def device_name(chip: NpuChip) -> str:
    """The name discovery publishes `chip` under, and every agent uses for it."""
    return f"npu-{chip.device_id}"


def device_names(chips: Sequence[NpuChip]) -> dict[tuple[int, int], str]:
    """(card, chip) -> device name, for every chip of one `npu-smi info`; NpuSmiError when two
    chips would get one name (discovery then keeps its last inventory)."""
    names: dict[tuple[int, int], str] = {}
    seen: set[str] = set()
    for chip in chips:
        name = device_name(chip)
        if name in seen:
            raise NpuSmiError(f"npu-smi info: two chips with device id {chip.device_id}")
        seen.add(name)
        names[(chip.npu_id, chip.chip_id)] = name
    return names


def vnpu_name(chip: NpuChip, vnpu_id: int) -> str:
    """The device name of the static vNPU `vnpu_id` of `chip`."""
    return f"{device_name(chip)}-vnpu-{vnpu_id}"


def option_name(chip: NpuChip, template: str, k: int) -> str:
    """The `k`-th option of `template` on `chip`: `npu-7-vnpu-vir02-1c-0` (RFC 1123)."""
    return f"{device_name(chip)}-vnpu-{template.replace('_', '-')}-{k}"


def templates(chip_name: str) -> tuple[str, ...]:
    """The templates a chip of this model makes at prepare (none for a model not listed)."""
    return TEMPLATES.get(chip_name.removeprefix("Ascend ").strip(), ())


def vnpu_ids(physical_id: int, chip_name: str) -> range:
    """The vNPU ids of a chip: `[phy*16+100, ...]`, 16 on training chips, 8 on 310P."""
    count = _INFERENCE_IDS if chip_name.startswith("310") else VNPU_IDS
    first = physical_id * VNPU_IDS + 100
    return range(first, first + count)


def on_demand_ids(physical_id: int, chip_name: str) -> range:
    """The upper half of the chip's vNPU ids: those the allocation agent makes vNPUs under."""
    ids = vnpu_ids(physical_id, chip_name)
    return ids[len(ids) // 2 :]


def template_cores(template: str) -> int | None:
    """The AI cores of a vNPU template (`vir05_1c_8g`: 5); None for a name that is not one."""
    match = TEMPLATE.match(template)
    return int(match.group(1)) if match is not None else None


def ai_cores(chip_name: str) -> int | None:
    """AI cores of a chip by name; a vNPU seen inside a pod (`310Pvir01`, `910B4vir05_1c_8g`)
    has its template's."""
    template = _IN_CHIP_NAME.search(chip_name)
    if template is not None:
        return int(template.group(1))
    return AI_CORES.get(chip_name.removeprefix("Ascend ").strip())


def counter_set_name(chip: NpuChip) -> str:
    return f"{device_name(chip)}-counter-set"


def counter_total(chip: NpuChip, templates: Iterable[str], *, total: int | None = None) -> int:
    """The AI cores of `chip`'s counter set: `total` (what npu-smi's vNPU view says), else the
    chip's by name; never fewer than its vNPUs' templates add up to, nor than one."""
    shares = [template_cores(t) or 0 for t in templates]
    known = total if total is not None else ai_cores(chip.name)
    return max(known or 0, sum(shares), 1)


def whole_chip_consumption(total: int) -> Mapping[str, str]:
    """What the whole chip consumes of its counter set: all of it."""
    return {AI_CORE_COUNTER: str(total)}


def vnpu_consumption(template: str, *, total: int) -> Mapping[str, str]:
    """What a vNPU of `template` consumes of its chip's counter set (`total` AI cores): its
    template's cores; all of them for a template name this model does not know, so that it
    still never goes together with anything else on the chip."""
    cores = template_cores(template)
    return {AI_CORE_COUNTER: str(min(cores, total) if cores else total)}
