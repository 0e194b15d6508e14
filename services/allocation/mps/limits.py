"""Which GPUs of a claim its MPS daemon serves, and with which limits (pure).

A GPU (kind `gpu`; MIG devices are isolated by MIG) is served when the claim got a share of
it (a share ID: consumable capacity) or its request's config asks for `SpacePartitioning`, and
never for a result with admin access (it gets the GPU as it is, outside any sharing).
Each served GPU's pinned device memory limit is the lower of the claim's consumed `memory` of
it (its shares summed) and the config's `memoryLimit`. The daemon's active thread percentage is
the config's `computePercent`; without one, the largest fraction of a served GPU's memory the
claim consumed, rounded up (a quarter of the memory, a quarter of the threads), or none.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from services.allocation.claim import opaque
from services.allocation.claim.checkpoint import PreparedMps
from services.allocation.claim.claims import DeviceResult
from services.allocation.claim.opaque import Strategy
from shared import quantity
from shared.pb.drasuite.v1 import inventory_pb2

__all__ = ["plan", "served"]

_MIB = 2**20


def plan(
    resolved: Sequence[tuple[DeviceResult, inventory_pb2.Device]],
    configs: Mapping[str, opaque.DeviceConfig],
) -> PreparedMps | None:
    """The claim's daemon, or None when it shares no GPU."""
    gpus: dict[str, inventory_pb2.Device] = {}
    consumed: dict[str, int] = {}
    configured: dict[str, int] = {}
    percentages: list[int] = []
    for result, device in resolved:
        config = configs.get(result.request)
        if not served(result, device, config):
            continue
        gpus.setdefault(device.name, device)
        memory = quantity.whole(result.consumed_capacity.get("memory"))
        if memory is not None:
            consumed[device.name] = consumed.get(device.name, 0) + memory
        if config is not None and config.memory_limit_bytes is not None:
            limit = config.memory_limit_bytes
            configured[device.name] = min(limit, configured.get(device.name, limit))
        if config is not None and config.compute_percent is not None:
            percentages.append(config.compute_percent)
    if not gpus:
        return None
    pinned = tuple(
        _mib(min(found)) if (found := _known(consumed.get(n), configured.get(n))) else None
        for n in gpus
    )
    percentage = min(percentages) if percentages else _share_percentage(gpus, consumed)
    return PreparedMps(
        devices=tuple(_mps_id(d) for d in gpus.values()),
        thread_percentage=percentage,
        pinned_mib=pinned,
    )


def served(
    result: DeviceResult, device: inventory_pb2.Device, config: opaque.DeviceConfig | None
) -> bool:
    """Whether the claim's daemon serves this result's GPU; never one with admin access, which
    takes no share of it (KEP-5018)."""
    if result.admin_access:
        return False
    partitioning = config is not None and config.strategy is Strategy.SPACE_PARTITIONING
    return device.kind == "gpu" and (result.share_id is not None or partitioning)


def _known(*values: int | None) -> list[int]:
    return [v for v in values if v is not None]


def _mib(n_bytes: int) -> int:
    return max(1, n_bytes // _MIB)


def _share_percentage(
    gpus: Mapping[str, inventory_pb2.Device], consumed: Mapping[str, int]
) -> int | None:
    fractions = []
    for name, device in gpus.items():
        total = quantity.whole(device.capacity.get("memory"))
        if name in consumed and total:
            fractions.append(consumed[name] / total)
    if not fractions:
        return None
    return min(100, max(1, math.ceil(max(fractions) * 100)))


def _mps_id(device: inventory_pb2.Device) -> str:
    """What the daemon's CUDA_VISIBLE_DEVICES names the GPU by: its UUID, else its index."""
    if device.uuid.startswith("GPU-"):
        return device.uuid
    if "uuid" in device.attributes and device.attributes["uuid"].string.startswith("GPU-"):
        return device.attributes["uuid"].string
    if "index" in device.attributes:
        return str(device.attributes["index"].int)
    return device.name.rsplit("-", 1)[-1]
