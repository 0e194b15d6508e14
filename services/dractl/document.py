"""dractl's `-o json` and `-o yaml`: plain objects with human field names and RFC 3339 times.

Not proto JSON (`sinceUnixMs: "1763..."`, enum names with their prefixes): one item per table
row, the same names in JSON and YAML, a time as `2026-11-24T08:07:58.533Z` (null when unset).
A listing is one document, a list; `alerts --follow` writes one object per line instead
(as `kubectl get -w -o json` does), since a stream never ends. Each command shapes its own
items with these helpers. No I/O beyond the given stream.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

import yaml

__all__ = ["Item", "dump", "rfc3339", "state_name"]

Item = dict[str, Any]


def rfc3339(unix_ms: int) -> str | None:
    if unix_ms <= 0:
        return None
    moment = datetime.fromtimestamp(unix_ms / 1000, tz=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def state_name(enum: Any, value: int, prefix: str) -> str:
    """`HEALTH_STATE_HEALTHY` -> `HEALTHY`; an unknown number stays a number."""
    try:
        return str(enum.Name(value)).removeprefix(prefix)
    except ValueError:
        return str(value)


def dump(items: Sequence[Item] | Item, *, output: str, out: TextIO) -> None:
    """One document: `json` (indented) or `yaml`; `json-line` is one object on one line."""
    if output == "yaml":
        yaml.safe_dump(items, out, sort_keys=False, allow_unicode=True)
    elif output == "json-line":
        out.write(json.dumps(items, separators=(",", ":")) + "\n")
    else:
        out.write(json.dumps(items, indent=2) + "\n")
    out.flush()
