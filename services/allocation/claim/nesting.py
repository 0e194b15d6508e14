"""How deeply a decoded JSON document nests, measured without recursion (pure).

A claim's opaque parameters are arbitrary JSON that the API server stores as given; whatever
walks them recursively (repr, json.dumps, a validator) dies of RecursionError somewhere near
1,000 levels. Claims are refused well before that, with the claim's own error.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MAX_CLAIM_DEPTH", "depth"]

MAX_CLAIM_DEPTH = 64
"""Levels of objects and lists a claim may have; a real one has about 10 (managedFields)."""


def depth(document: Any, *, limit: int) -> int:
    """Levels of dicts and lists in `document` (a scalar is 0); counting stops at `limit` + 1."""
    deepest = 0
    pending: list[tuple[Any, int]] = [(document, 0)]
    while pending:
        value, level = pending.pop()
        if isinstance(value, dict):
            children: Any = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        level += 1
        deepest = max(deepest, level)
        if deepest > limit:
            return deepest
        pending.extend((child, level) for child in children)
    return deepest
