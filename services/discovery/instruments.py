"""The discovery agent's metrics: failed backend scans, and whether the backend is failing now.
Exposed at the agent's /metrics (shared/metrics.py)."""

from __future__ import annotations

from shared import metrics

__all__ = ["SCANS_FAILED", "SCAN_FAILING"]

_meter = metrics.meter("dra.discovery")

SCANS_FAILED = _meter.create_counter(
    "dra_backend_scans_failed",
    unit="1",
    description="Backend scans that failed (the last good inventory stayed published), by backend.",
)
SCAN_FAILING = _meter.create_up_down_counter(
    "dra_backend_scan_failing",
    unit="1",
    description="1 while the backend's scans fail (from the first failure to the next success).",
)
