"""Seeing a stored object through another served version of the same storage.

DeviceTaintRule v1alpha3/v1beta2 differ only in apiVersion; core/v1 and
events.k8s.io/v1 Events rename fields. Returns a new top-level dict (nested
values are shared and must not be mutated). Pure.
"""

from __future__ import annotations

from typing import Any

from devcluster.apiserver.registry import ResourceType

__all__ = ["view"]

_EVENTS_TO_CORE = {
    "regarding": "involvedObject",
    "note": "message",
    "deprecatedSource": "source",
    "deprecatedFirstTimestamp": "firstTimestamp",
    "deprecatedLastTimestamp": "lastTimestamp",
    "deprecatedCount": "count",
    "reportingController": "reportingComponent",
}
_CORE_TO_EVENTS = {v: k for k, v in _EVENTS_TO_CORE.items()}


def view(obj: dict[str, Any], rt: ResourceType) -> dict[str, Any]:
    """`obj` as `rt`'s apiVersion/kind would show it (`obj` itself when it already is)."""
    if obj.get("apiVersion") == rt.api_version:
        return obj
    renames: dict[str, str] = {}
    if rt.storage == "events":
        renames = _CORE_TO_EVENTS if rt.group else _EVENTS_TO_CORE
    out = {renames.get(k, k): v for k, v in obj.items()}
    out["apiVersion"] = rt.api_version
    out["kind"] = rt.kind
    return out
