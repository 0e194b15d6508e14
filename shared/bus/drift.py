"""How an existing stream's config differs from the one wanted, field by field, in wire form.

Every field the server reports is compared, also those this client library does not know
(`subject_transform`, `sources`, `mirror`, `republish`, anything a later server adds): a field
the wanted config leaves out must be absent or empty. Metadata the server writes itself
(`_nats.*`) is not part of the config. Fields in `grow_only` only ever grow (replicas: a client
left at 1 must not shrink a stream an operator made R3). A drift says which fields differ,
whether an update can fix them, the config to update to, and the `nats` command for it. Pure.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["FIXED", "Drift", "drift"]

FIXED = ("storage", "retention", "mirror")
"""Fields nats-server never changes on a live stream."""
_SERVER_METADATA = "_nats."

_CLI_FLAGS = {
    "num_replicas": "--replicas",
    "max_age": "--max-age",
    "duplicate_window": "--dupe-window",
    "subjects": "--subjects",
    "allow_direct": "--allow-direct",
    "max_consumers": "--max-consumers",
}


def _empty(value: Any) -> bool:
    return value is None or value is False or value == 0 or value in ("", [], {})


def _normal(field: str, value: Any) -> Any:
    if field == "subjects":
        return sorted(value or [])
    if field == "metadata":
        value = {k: v for k, v in (value or {}).items() if not k.startswith(_SERVER_METADATA)}
    return None if _empty(value) else value


@dataclass(frozen=True, slots=True)
class Drift:
    stream: str
    changes: Mapping[str, tuple[Any, Any]]
    """Field -> (current, wanted), for each field that differs."""
    target: Mapping[str, Any]
    """The config to update to: the wanted one, grow-only fields at their larger value."""

    def __bool__(self) -> bool:
        return bool(self.changes)

    @property
    def in_place(self) -> bool:
        """An update fixes every difference (no fixed field differs)."""
        return not any(field in self.changes for field in FIXED)

    def without(self, fields: Iterable[str]) -> Drift:
        """The same drift, `fields` left out (those an operator may change)."""
        skip = set(fields)
        kept = {f: c for f, c in self.changes.items() if f not in skip}
        return Drift(stream=self.stream, changes=kept, target=self.target)

    def command(self) -> str:
        """The `nats` CLI line for the changes (as a user allowed `$JS.API.STREAM.UPDATE`);
        where a field has no flag, the whole config from a file."""
        if any(field not in _CLI_FLAGS for field in self.changes):
            return f"nats stream edit {self.stream} --config <the config in the log> --force"
        args = [f"nats stream edit {self.stream}"]
        for field, (_, wanted) in sorted(self.changes.items()):
            match wanted:
                case bool():
                    args.append(_CLI_FLAGS[field] if wanted else f"--no-{_CLI_FLAGS[field][2:]}")
                case list():
                    args.append(f"{_CLI_FLAGS[field]} {','.join(wanted)}")
                case int() if field in ("max_age", "duplicate_window"):
                    args.append(f"{_CLI_FLAGS[field]} {wanted // 1_000_000_000}s")
                case _:
                    args.append(f"{_CLI_FLAGS[field]} {wanted}")
        return " ".join([*args, "--force"])

    def summary(self) -> dict[str, str]:
        """Field -> "current -> wanted", for the log line and errors."""
        return {
            f: f"{json.dumps(c, sort_keys=True)} -> {json.dumps(w, sort_keys=True)}"
            for f, (c, w) in sorted(self.changes.items())
        }


def drift(
    current: Mapping[str, Any],
    wanted: Mapping[str, Any],
    *,
    grow_only: Iterable[str] = ("num_replicas",),
) -> Drift:
    """Compare every field of `current` (a stream config as the server reports it) with
    `wanted` (a config in the same form)."""
    grow = set(grow_only)
    changes: dict[str, tuple[Any, Any]] = {}
    target = dict(wanted)
    for field in sorted(set(current) | set(wanted)):
        have, want = current.get(field), wanted.get(field)
        if field in grow and isinstance(have, int) and isinstance(want, int):
            target[field] = max(have, want)
            if have >= want:
                continue
        if _normal(field, have) != _normal(field, want):
            changes[field] = (have, want)
    return Drift(stream=str(wanted.get("name") or current.get("name") or ""), changes=changes,
                 target=target)  # fmt: skip
