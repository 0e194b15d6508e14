"""The allocation agent's metrics: per-claim prepare/unprepare latency by outcome, failed
prepares and unprepares, the number of prepared claims, container edits refused by the
backend's allowlist, and inventories quarantined by the sanity rules. Exposed at the agent's
/metrics (shared/metrics.py). The failure and quarantine counters are exported at 0 from the
start (`metrics.export_at_zero`), so the alert rules see their first event."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

from opentelemetry.metrics import CallbackOptions, Histogram, Observation

from shared import inventory_sanity, metrics
from shared.bus import ownkeys

__all__ = [
    "CLAIM_FAILURES",
    "INVENTORY_REJECTED",
    "PREPARED_CLAIMS_REASSERTED",
    "PREPARE_SECONDS",
    "REJECTED_EDITS",
    "UNPREPARE_SECONDS",
    "observe_prepared_claims",
    "timed",
]

T = TypeVar("T")
_meter = metrics.meter("dra.allocation")
# From a repeat prepare (sub-millisecond) to a prepare near the kubelet's 45 s deadline.
_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 45)

PREPARE_SECONDS = _meter.create_histogram(
    "dra_prepare_duration",
    unit="s",
    description="Time to prepare one claim (NodePrepareResources), by outcome.",
    explicit_bucket_boundaries_advisory=_BUCKETS_S,
)
UNPREPARE_SECONDS = _meter.create_histogram(
    "dra_unprepare_duration",
    unit="s",
    description="Time to unprepare one claim (NodeUnprepareResources), by outcome.",
    explicit_bucket_boundaries_advisory=_BUCKETS_S,
)

_OPERATIONS = {id(PREPARE_SECONDS): "prepare", id(UNPREPARE_SECONDS): "unprepare"}

REJECTED_EDITS = _meter.create_counter(
    "dra_prepare_rejected_edits",
    unit="1",
    description="CDI container edits refused at prepare because the node's backend never makes "
    "them (a forged or damaged inventory), by backend and kind of edit.",
)

INVENTORY_REJECTED = _meter.create_counter(
    "dra_inventory_rejected",
    unit="1",
    description="Inventories of this node quarantined by the sanity rules or refused for naming "
    "another backend than the node's own (the last good one stayed in force), by reason: "
    "empty, generation_backwards, generation_reused, backend_changed, backend_mismatch.",
)
# inventory_cache.BACKEND_MISMATCH (that module imports this one).
metrics.export_at_zero(
    INVENTORY_REJECTED,
    *({"reason": reason} for reason in (*inventory_sanity.REASONS, "backend_mismatch")),
)

PREPARED_CLAIMS_REASSERTED = _meter.create_counter(
    "dra_prepared_claims_reasserted",
    unit="1",
    description="Prepared-claim values of this node put back at once after another writer "
    "emptied, replaced or deleted them, by reason: differs, deleted, rejected (refused by the "
    "record check).",
)
metrics.export_at_zero(PREPARED_CLAIMS_REASSERTED, *({"reason": r} for r in ownkeys.REASONS))

CLAIM_FAILURES = _meter.create_counter(
    "dra_claim_failures",
    unit="1",
    description="Claims whose prepare or unprepare failed (the outcome=error observations of "
    "the duration histograms), by operation; exported at 0 from the start.",
)
metrics.export_at_zero(CLAIM_FAILURES, {"operation": "prepare"}, {"operation": "unprepare"})


async def timed(histogram: Histogram, step: Awaitable[T]) -> T:
    """Await one claim's step and record its duration with outcome ok or error (an error of
    a prepare or unprepare also counts in `dra_claim_failures`)."""
    start = time.perf_counter()
    outcome = "error"
    try:
        result = await step
        outcome = "ok"
        return result
    finally:
        histogram.record(time.perf_counter() - start, {"outcome": outcome})
        operation = _OPERATIONS.get(id(histogram))
        if outcome == "error" and operation is not None:
            CLAIM_FAILURES.add(1, {"operation": operation})


def observe_prepared_claims(count: Callable[[], int]) -> None:
    """Report `count()` as the prepared-claims gauge at every scrape."""

    def observe(_: CallbackOptions) -> Iterable[Observation]:
        yield Observation(count())

    _meter.create_observable_gauge(
        "dra_prepared_claims",
        callbacks=[observe],
        unit="1",
        description="Claims with a prepare record in the checkpoint.",
    )
