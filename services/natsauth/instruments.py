"""The auth service's metrics: every decision (outcome, role, refusal reason); revocations."""

from __future__ import annotations

from shared import metrics

__all__ = ["DECISIONS", "REVOCATIONS"]

DECISIONS = metrics.meter(__name__).create_counter(
    "dra_nats_auth_decisions",
    unit="1",
    description="NATS connection authorizations by outcome (allowed/refused), role and reason.",
)

REVOCATIONS = metrics.meter(__name__).create_counter(
    "dra_nats_auth_revocations",
    unit="1",
    description="Node revocations seen (event=revoked/unrevoked) and connections kicked "
    "(event=kicked).",
)
