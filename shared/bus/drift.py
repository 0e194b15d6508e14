"""How an existing stream (a KV bucket's or the alert stream) differs from the settings wanted.

JetStream changes replicas, subjects, retention age, duplicate window and direct gets of a
live stream in place; the storage type it never changes. A drift says which fields differ,
whether an update can fix them, the updated config (the current one with only those fields
changed, so nothing else is reset), and the `nats` CLI command an operator runs where the
agent may not update streams itself. Never a delete: data stays. Pure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nats.js import api

__all__ = ["IN_PLACE", "Drift", "drift"]

IN_PLACE = (
    "num_replicas",
    "subjects",
    "max_age",
    "duplicate_window",
    "allow_direct",
    "max_consumers",
)
"""Fields nats-server updates on a live stream (replicas only on a cluster)."""
_FIXED = ("storage",)
_GROW_ONLY = ("num_replicas", "max_consumers")
# What nats-server 2.15 enforces for a stream whose max_consumers is unset (-1 or 0).
_SERVER_DEFAULT_CONSUMERS = 1000

_CLI_FLAGS = {
    "num_replicas": "--replicas",
    "max_age": "--max-age",
    "duplicate_window": "--dupe-window",
    "subjects": "--subjects",
    "allow_direct": "--allow-direct",
    "max_consumers": "--max-consumers",
}


def _normal(field: str, value: Any) -> Any:
    if field == "subjects":
        return sorted(value or [])
    if field in ("max_age", "duplicate_window"):
        return float(value or 0.0)
    if field == "num_replicas":
        return int(value or 1)
    if field == "max_consumers":
        return int(value) if value and value > 0 else _SERVER_DEFAULT_CONSUMERS
    if field == "allow_direct":
        return bool(value)
    return value


@dataclass(frozen=True, slots=True)
class Drift:
    stream: str
    changes: Mapping[str, tuple[Any, Any]]
    """Field -> (current, wanted), for each field that differs."""

    def __bool__(self) -> bool:
        return bool(self.changes)

    @property
    def in_place(self) -> bool:
        """An update fixes every difference (no fixed field differs)."""
        return not any(field in self.changes for field in _FIXED)

    def updated(self, current: api.StreamConfig) -> api.StreamConfig:
        """`current` with the wanted value of every in-place field that differs."""
        wanted = {f: w for f, (_, w) in self.changes.items() if f in IN_PLACE}
        return dataclasses.replace(current, **wanted)

    def command(self) -> str:
        """The `nats` CLI line that applies the in-place changes (as a user allowed
        `$JS.API.STREAM.UPDATE` in the stream's account)."""
        args = [f"nats stream edit {self.stream}"]
        for field, (_, wanted) in sorted(self.changes.items()):
            if field not in _CLI_FLAGS:
                continue
            match wanted:
                case bool():
                    args.append(_CLI_FLAGS[field] if wanted else f"--no-{_CLI_FLAGS[field][2:]}")
                case list():
                    args.append(f"{_CLI_FLAGS[field]} {','.join(wanted)}")
                case float():
                    args.append(f"{_CLI_FLAGS[field]} {int(wanted)}s")
                case _:
                    args.append(f"{_CLI_FLAGS[field]} {wanted}")
        return " ".join([*args, "--force"])

    def summary(self) -> dict[str, str]:
        """Field -> "current -> wanted", for the log line."""
        return {f: f"{c} -> {w}" for f, (c, w) in sorted(self.changes.items())}


def drift(current: api.StreamConfig, wanted: Mapping[str, Any]) -> Drift:
    """Compare the fields named in `wanted` (StreamConfig field names) with `current`.

    Replicas and the consumer limit only ever grow: a client left at the default of 1 (a tool,
    an agent not yet rolled) must not shrink a bucket that an operator or the cluster's agents
    made R3."""
    changes: dict[str, tuple[Any, Any]] = {}
    for field, value in wanted.items():
        have, want = _normal(field, getattr(current, field)), _normal(field, value)
        if field in _GROW_ONLY and want < have:
            continue
        if have != want:
            changes[field] = (getattr(current, field), value)
    return Drift(stream=current.name or "", changes=changes)
