"""`bench/results.json`: each benchmark merges its figures into it, keeping the others'."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["merge"]


def merge(path: Path, figures: Mapping[str, Any]) -> None:
    """Write `figures` into the JSON object at `path` (created if missing), over same keys."""
    results: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    results.update(figures)
    path.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
