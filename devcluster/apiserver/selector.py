"""Label and field selectors as kube-apiserver parses them from list/watch query strings.

`parse_labels("a=b,c!=d,e in (x,y),!f")` and `parse_fields("spec.nodeName=n1")`
return predicates over stored objects. Parse errors raise `APIError` 400. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from devcluster.apiserver.errors import bad_request

__all__ = ["Predicate", "field_value", "parse_fields", "parse_labels"]

Predicate = Callable[[dict[str, Any]], bool]
_SET_RE = re.compile(r"^\s*(!?)\s*([^\s!=<>(),]+)\s*(?:(notin|in)\s*\(([^)]*)\))?\s*$")


def _split_terms(text: str) -> list[str]:
    """Split on commas outside parentheses and not escaped with a backslash."""
    terms, depth, current, escaped = [], 0, "", False
    for ch in text:
        if escaped:
            current += "\\" + ch
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == "," and depth == 0:
            terms.append(current)
            current = ""
        else:
            depth += {"(": 1, ")": -1}.get(ch, 0)
            current += ch
    terms.append(current)
    return [t.strip() for t in terms if t.strip()]


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", r"\1", value)


def _equality(term: str) -> tuple[str, str, str] | None:
    for op in ("!=", "==", "="):
        key, sep, value = term.partition(op)
        if sep:
            return key.strip(), op, _unescape(value.strip())
    return None


def _requirement(term: str) -> tuple[str, str, frozenset[str]]:
    """(key, op, values) with op one of =, !=, in, notin, exists, !exists."""
    eq = _equality(term)
    if eq is not None:
        key, op, value = eq
        return key, "!=" if op == "!=" else "=", frozenset({value})
    match = _SET_RE.match(term)
    if match is None:
        raise bad_request(f"unable to parse requirement: invalid label selector: {term!r}")
    negate, key, op, values = match.groups()
    if op:
        return key, op, frozenset(v.strip() for v in values.split(",") if v.strip())
    return key, "!exists" if negate else "exists", frozenset()


def _satisfied(labels: dict[str, str], key: str, op: str, values: frozenset[str]) -> bool:
    if op in ("exists", "!exists"):
        return (key in labels) == (op == "exists")
    present = key in labels and labels[key] in values
    return present if op in ("=", "in") else not present


def parse_labels(text: str) -> Predicate | None:
    """Predicate on metadata.labels; None when the selector is empty (everything matches)."""
    requirements = [_requirement(term) for term in _split_terms(text)]
    if not requirements:
        return None

    def predicate(obj: dict[str, Any]) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return all(_satisfied(labels, *r) for r in requirements)

    return predicate


def field_value(obj: dict[str, Any], path: str) -> str:
    """The string form of a dotted field path (`spec.nodeName`); "" when absent."""
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def parse_fields(text: str, allowed: frozenset[str] | None) -> Predicate | None:
    """Predicate for `=`/`==`/`!=` terms; labels outside `allowed` are a 400 like kube."""
    checks: list[tuple[str, bool, str]] = []
    for term in _split_terms(text):
        eq = _equality(term)
        if eq is None:
            raise bad_request(f"invalid field selector: {term!r}: expected = , == or !=")
        key, op, value = eq
        if allowed is not None and key not in allowed:
            raise bad_request(f'field label not supported: "{key}"')
        checks.append((key, op != "!=", value))
    if not checks:
        return None
    return lambda obj: all((field_value(obj, k) == v) == want for k, want, v in checks)
