"""Does a claim's `status.allocation.nodeSelector` select this node? (pure)

The scheduler's allocator (k8s.io/dynamic-resource-allocation/structured, createNodeSelector)
writes one of: no selector (devices available everywhere); for a device of a node-local slice,
as ours are, one term `matchFields: [{key: metadata.name, operator: In, values: [<node>]}]`;
otherwise one term merged from the slices' own selectors. Terms are ORed, the requirements of a
term ANDed, as in core/v1. This agent knows its node's name, and the `kubernetes.io/hostname`
label as kubelets set it by default (the node name); a requirement on anything else cannot be
checked here, so its term does not count as selecting this node.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["HOSTNAME_LABEL", "NAME_FIELD", "mismatch"]

NAME_FIELD = "metadata.name"
HOSTNAME_LABEL = "kubernetes.io/hostname"
_SHOWN = 64


def _requirement(raw: Any, *, node: str, known_key: str) -> str | None:
    """None when the requirement holds for `node`, else why not."""
    if not isinstance(raw, Mapping):
        return "a requirement that is not an object"
    key, operator = str(raw.get("key", ""))[:_SHOWN], str(raw.get("operator", ""))[:_SHOWN]
    values = raw.get("values") or []
    if key != known_key:
        return f"{key!r} (not checkable on the node)"
    if not isinstance(values, list):
        return f"{key} {operator} with values that are not a list"
    named = node in values
    holds = {"In": named, "NotIn": not named, "Exists": True, "DoesNotExist": False}.get(operator)
    if holds is None:
        return f"{key} with operator {operator!r}"
    if not holds:
        shown = ", ".join(repr(str(v)[:_SHOWN]) for v in values[:4])
        return f"{key} {operator} [{shown}{', ...' if len(values) > 4 else ''}]"
    return None


def _term(raw: Any, *, node: str) -> str | None:
    """None when every requirement of the term holds for `node`, else the first that does not."""
    if not isinstance(raw, Mapping):
        return "a term that is not an object"
    fields, expressions = raw.get("matchFields") or [], raw.get("matchExpressions") or []
    if not isinstance(fields, list) or not isinstance(expressions, list):
        return "a term whose requirements are not lists"
    if not fields and not expressions:
        return "an empty term (selects no node)"
    checks = [(r, NAME_FIELD) for r in fields] + [(r, HOSTNAME_LABEL) for r in expressions]
    for requirement, known_key in checks:
        if (why := _requirement(requirement, node=node, known_key=known_key)) is not None:
            return why
    return None


def mismatch(selector: Any, *, node: str) -> str | None:
    """None when `selector` (a core/v1 NodeSelector, or None) selects `node`, else why not."""
    if selector is None:
        return None
    if not isinstance(selector, Mapping):
        return "nodeSelector is not an object"
    terms = selector.get("nodeSelectorTerms")
    if not isinstance(terms, list) or not terms:
        return "nodeSelector has no terms (selects no node)"
    reasons = []
    for raw in terms:
        why = _term(raw, node=node)
        if why is None:
            return None
        reasons.append(why)
    return f"nodeSelector does not select node {node}: {'; '.join(reasons[:4])}"
