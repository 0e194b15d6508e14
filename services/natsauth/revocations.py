"""The revoked nodes: who may not connect to the bus, until when, and why.

The list is ConfigMap `dra-nats-auth-revocations` (namespace of the service), one data key per
node, the value a JSON object `{"until": RFC 3339 or null, "reason": str, "at": RFC 3339}`.
A value that does not parse revokes its node with no end: a typo must not let a node back in.
Pure: parsing, encoding, and what is in force at a given time.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

__all__ = ["CONFIGMAP", "Revocation", "active_nodes", "at_now", "encode", "encode_line", "parse"]

CONFIGMAP = "dra-nats-auth-revocations"


@dataclass(frozen=True, slots=True)
class Revocation:
    node: str
    until: float | None = None
    """Epoch seconds after which the node may connect again; None: until unrevoked."""
    reason: str = ""
    at: str = ""
    """When it was revoked (RFC 3339), for the record."""
    malformed: bool = False

    def active(self, now: float) -> bool:
        return self.until is None or now < self.until


def _timestamp(value: float) -> str:
    return datetime.fromtimestamp(value, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _epoch(value: str) -> float:
    parsed = datetime.fromisoformat(value)
    if parsed.tzinfo is None:
        raise ValueError(f"{value!r} has no time zone")
    return parsed.timestamp()


def encode(revocation: Revocation) -> str:
    until = None if revocation.until is None else _timestamp(revocation.until)
    return json.dumps({"until": until, "reason": revocation.reason, "at": revocation.at})


def _one(node: str, value: str) -> Revocation:
    try:
        body = json.loads(value)
        until = body.get("until")
        return Revocation(
            node=node,
            until=None if until is None else _epoch(str(until)),
            reason=str(body.get("reason", "")),
            at=str(body.get("at", "")),
        )
    except (ValueError, TypeError, AttributeError):
        return Revocation(node=node, reason="unreadable entry", malformed=True)


def parse(data: Mapping[str, str] | None) -> dict[str, Revocation]:
    """The ConfigMap's `data`, by node."""
    return {node: _one(node, value) for node, value in (data or {}).items()}


def active_nodes(entries: Mapping[str, Revocation], *, now: float) -> frozenset[str]:
    return frozenset(node for node, entry in entries.items() if entry.active(now))


def at_now(now: float) -> str:
    return _timestamp(now)


def encode_line(revocation: Revocation) -> str:
    """One line for people: node, until, since, reason."""
    until = "-" if revocation.until is None else _timestamp(revocation.until)
    return f"{revocation.node}\tuntil={until}\tat={revocation.at or '-'}\t{revocation.reason}"
