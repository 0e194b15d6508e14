"""NVML events and counters to faults, and which fault a GPU shows when it has several."""

from __future__ import annotations

import pytest

from shared.vendors.nvidia import nvml_faults
from shared.vendors.nvidia.nvml_events import (
    EVENT_DOUBLE_BIT_ECC,
    EVENT_GPU_UNAVAILABLE,
    EVENT_SINGLE_BIT_ECC,
    EVENT_XID,
    NVMLEvent,
    RemappedRows,
)
from shared.vendors.parts.observation import Fault

XID = Fault(cause="xid", code="79")
ECC = Fault(cause="ecc", code="double-bit")
LOST = Fault(cause="gpu-lost")
REMAP = Fault(cause="row-remap", code="pending")
CLEAN = RemappedRows(corrected=3, uncorrected=0, pending=False, failed=False)
PENDING = RemappedRows(corrected=0, uncorrected=1, pending=True, failed=False)
FAILED = RemappedRows(corrected=0, uncorrected=1, pending=True, failed=True)


@pytest.mark.parametrize(
    ("event_type", "data", "expected"),
    [
        (EVENT_XID, 79, ("xid", "79")),
        (EVENT_XID, 13, ("xid", "13")),
        (EVENT_DOUBLE_BIT_ECC, 0, ("ecc", "double-bit")),
        (EVENT_SINGLE_BIT_ECC, 0, None),
        (EVENT_GPU_UNAVAILABLE, 0, ("gpu-lost", "")),
        (0x4, 0, None),
    ],
    ids=[
        "xid 79",
        "xid 13 (the policy ignores it)",
        "double-bit",
        "single-bit",
        "unavailable",
        "pstate",
    ],
)
def test_event_fault(event_type, data, expected):
    fault = nvml_faults.event_fault(NVMLEvent(uuid="GPU-1", event_type=event_type, data=data))
    assert ((fault.cause, fault.code) if fault else None) == expected


@pytest.mark.parametrize(
    ("double_bit", "rows", "pages", "expected"),
    [
        (0, CLEAN, None, None),
        (None, None, None, None),
        (3, CLEAN, None, ("ecc", "double-bit")),
        (0, PENDING, None, ("row-remap", "pending")),
        (0, FAILED, None, ("row-remap", "failed")),
        (None, None, True, ("page-retirement", "pending")),
        (2, FAILED, True, ("ecc", "double-bit")),
    ],
    ids=[
        "clean counters",
        "nothing supported",
        "volatile double-bit errors",
        "remap pending",
        "remap failed wins over pending",
        "pages pending (pre-Ampere)",
        "double-bit wins over all",
    ],
)
def test_counter_fault(double_bit, rows, pages, expected):
    fault = nvml_faults.counter_fault(double_bit=double_bit, rows=rows, pages_pending=pages)
    assert ((fault.cause, fault.code) if fault else None) == expected


@pytest.mark.parametrize(
    ("faults", "expected"),
    [
        ((None, None), None),
        ((XID, None), XID),
        ((None, REMAP), REMAP),
        ((REMAP, XID), XID),
        ((XID, ECC), ECC),
        ((ECC, LOST), LOST),
        ((XID, Fault(cause="xid", code="48")), XID),
    ],
    ids=[
        "none",
        "one",
        "the other",
        "xid over remap",
        "ecc over xid",
        "lost over all",
        "first of equals",
    ],
)
def test_worst_picks_the_most_severe_fault(faults, expected):
    assert nvml_faults.worst(*faults) == expected
