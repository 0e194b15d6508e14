"""Ascend error codes to faults (pure), after the vendor device plugin's fault levels.

docs/hardware.md §3.7: each code has a level; the most severe level of a chip's codes decides.
NotHandleFault is no fault; SubHealthFault becomes cause `npu-subhealth` (informational by
default), the restart levels cause `npu-restart` (transient), the separate levels cause
`npu` (fatal). A code missing from the table isolates the device (SeparateNPU), as the
vendor's plugin does for anything above Minor, unless `isolate_unknown` is off.
"""

from __future__ import annotations

from collections.abc import Sequence

from shared.vendors.parts.observation import Fault

__all__ = ["KNOWN_CODES", "LEVELS", "fault_for", "level_of"]

LEVELS = (
    "NotHandleFault",
    "SubHealthFault",
    "RestartRequest",
    "RestartBusiness",
    "FreeRestartNPU",
    "RestartNPU",
    "PreSeparateNPU",
    "SeparateNPU",
    "ManuallySeparateNPU",
)
"""Least severe first."""

KNOWN_CODES = {
    "80E21007": "NotHandleFault",
    "81A3880C": "SubHealthFault",
    "80C98008": "RestartRequest",
    "8C204E00": "RestartBusiness",
    "8C0E4E00": "FreeRestartNPU",
    "8C03A000": "RestartNPU",
    "8118043C": "PreSeparateNPU",
    "81078603": "PreSeparateNPU",
    "80E3A201": "SeparateNPU",
    "80E18402": "SeparateNPU",
}
"""The example codes of docs/hardware.md §3.7 (faultCode.json holds ~800)."""

_CAUSES = {
    "SubHealthFault": "npu-subhealth",
    "RestartRequest": "npu-restart",
    "RestartBusiness": "npu-restart",
    "FreeRestartNPU": "npu-restart",
    "RestartNPU": "npu-restart",
}


def level_of(code: str, *, isolate_unknown: bool) -> str:
    known = KNOWN_CODES.get(code.upper())
    if known is not None:
        return known
    return "SeparateNPU" if isolate_unknown else "NotHandleFault"


def fault_for(
    codes: Sequence[str], *, status: str, information: str = "", isolate_unknown: bool = True
) -> Fault | None:
    """The fault a chip's error codes amount to; None when none needs handling."""
    if not codes:
        return None
    levels = {code: level_of(code, isolate_unknown=isolate_unknown) for code in codes}
    worst = max(codes, key=lambda code: LEVELS.index(levels[code]))
    level = levels[worst]
    if level == "NotHandleFault":
        return None
    unknown = "" if worst.upper() in KNOWN_CODES else " (unknown code)"
    detail = f"; {information}" if information else ""
    return Fault(
        cause=_CAUSES.get(level, "npu"),
        code=worst.upper(),
        message=f"npu-smi {status}: {level}{unknown}, codes {' '.join(codes)}{detail}",
    )
