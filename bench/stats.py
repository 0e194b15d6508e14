"""Percentiles over latency samples (nearest-rank, as latency reports usually quote them)."""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["percentile"]


def percentile(samples: Sequence[float], pct: float) -> float:
    if not samples:
        raise ValueError("no samples")
    ordered = sorted(samples)
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]
