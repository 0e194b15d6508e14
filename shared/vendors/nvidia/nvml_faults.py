"""NVML events and counters to faults (pure), after NVIDIA's plugins (docs/hardware.md §2.4-2.5).

An XID event is cause `xid` with the XID as code (whether it is an application error is the
policy's call: its ignore list); a double-bit ECC event or a non-zero volatile double-bit
count is `ecc`/`double-bit`; "GPU unavailable" and NVML_ERROR_GPU_IS_LOST are `gpu-lost`.
Single-bit ECC events are no fault (NVIDIA's plugins ignore them too). Counters: a failed row
remap is `row-remap`/`failed`, a pending one `row-remap`/`pending`, pending page retirement
`page-retirement`/`pending`. A device shows its most severe fault (`worst`).
"""

from __future__ import annotations

from shared.vendors.nvidia.nvml_events import (
    EVENT_DOUBLE_BIT_ECC,
    EVENT_GPU_UNAVAILABLE,
    EVENT_XID,
    NO_INSTANCE,
    NVMLEvent,
    RemappedRows,
)
from shared.vendors.parts.observation import Fault

__all__ = [
    "DOUBLE_BIT",
    "ECC",
    "GPU_LOST",
    "PAGE_RETIREMENT",
    "ROW_REMAP",
    "XID",
    "counter_fault",
    "event_fault",
    "lost",
    "severity",
    "worst",
]

XID = "xid"
ECC = "ecc"
GPU_LOST = "gpu-lost"
ROW_REMAP = "row-remap"
PAGE_RETIREMENT = "page-retirement"
DOUBLE_BIT = "double-bit"
_SEVERITY = {GPU_LOST: 5, ECC: 4, XID: 3, ROW_REMAP: 2, PAGE_RETIREMENT: 1}


def severity(fault: Fault | None) -> int:
    """Higher is worse; 0 for no fault."""
    return 0 if fault is None else _SEVERITY.get(fault.cause, 1)


def worst(*faults: Fault | None) -> Fault | None:
    """The most severe of `faults` (the first of equals); None when there is none."""
    found: Fault | None = None
    for fault in faults:
        if severity(fault) > severity(found):
            found = fault
    return found


def lost(message: str) -> Fault:
    return Fault(cause=GPU_LOST, message=message)


def _instance(event: NVMLEvent) -> str:
    if event.gpu_instance_id == NO_INSTANCE:
        return ""
    return f" (GPU instance {event.gpu_instance_id}, compute instance {event.compute_instance_id})"


def event_fault(event: NVMLEvent) -> Fault | None:
    """The fault an event reports; None for events that are no fault (single-bit ECC, …)."""
    where = _instance(event)
    if event.event_type & EVENT_GPU_UNAVAILABLE:
        return lost(f"NVML reports the GPU unavailable{where}")
    if event.event_type & EVENT_XID:
        return Fault(cause=XID, code=str(event.data), message=f"XID {event.data}{where}")
    if event.event_type & EVENT_DOUBLE_BIT_ECC:
        return Fault(cause=ECC, code=DOUBLE_BIT, message=f"double-bit ECC error event{where}")
    return None


def counter_fault(
    *, double_bit: int | None, rows: RemappedRows | None, pages_pending: bool | None
) -> Fault | None:
    """The fault the periodic counters show (None: a counter the GPU does not support)."""
    if double_bit:
        return Fault(
            cause=ECC,
            code=DOUBLE_BIT,
            message=f"{double_bit} volatile double-bit ECC errors since the last reset",
        )
    if rows is not None and rows.failed:
        return Fault(cause=ROW_REMAP, code="failed", message="a row remap failed")
    if rows is not None and rows.pending:
        return Fault(
            cause=ROW_REMAP,
            code="pending",
            message=f"row remap pending a GPU reset ({rows.uncorrected} uncorrectable rows)",
        )
    if pages_pending:
        return Fault(
            cause=PAGE_RETIREMENT, code="pending", message="page retirement pending a GPU reset"
        )
    return None
