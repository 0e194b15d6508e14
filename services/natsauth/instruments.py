"""The auth service's metrics: every decision, by outcome, role and refusal reason."""

from __future__ import annotations

from shared import metrics

__all__ = ["DECISIONS"]

DECISIONS = metrics.meter(__name__).create_counter(
    "dra_nats_auth_decisions",
    unit="1",
    description="NATS connection authorizations by outcome (allowed/refused), role and reason.",
)
