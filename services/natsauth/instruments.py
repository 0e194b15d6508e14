"""The auth service's metrics: every decision (outcome, role, refusal reason); revocations;
nodes over their bucket quota and the entries deleted for it."""

from __future__ import annotations

from shared import metrics

__all__ = ["DECISIONS", "QUOTA_EXCEEDED", "QUOTA_KEYS_DELETED", "REVOCATIONS"]

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

QUOTA_EXCEEDED = metrics.meter(__name__).create_counter(
    "dra_bus_quota_exceeded",
    unit="1",
    description="Nodes revoked for going over their quota of keys or bytes in a bucket.",
)

QUOTA_KEYS_DELETED = metrics.meter(__name__).create_counter(
    "dra_bus_quota_keys_deleted",
    unit="1",
    description="Entries over a node's bucket quota deleted by the quota auditor.",
)
