"""Read verbs: get and list with label/field selectors and limit/continue paging.

Works on the store's objects through `conversion.view`; returns response bodies
that share nested values with stored objects (serialize them, do not mutate).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from devcluster.apiserver import errors
from devcluster.apiserver.conversion import view
from devcluster.apiserver.registry import ResourceType
from devcluster.apiserver.selector import Predicate, parse_fields, parse_labels
from devcluster.apiserver.store import Store

__all__ = ["Selection", "list_body", "matching"]


@dataclass(frozen=True, slots=True)
class Selection:
    """Which objects a list, watch or deletecollection is about."""

    namespace: str | None
    labels: Predicate | None = None
    fields: Predicate | None = None

    @classmethod
    def from_query(
        cls, rt: ResourceType, namespace: str | None, query: Mapping[str, str]
    ) -> Selection:
        return cls(
            namespace=namespace,
            labels=parse_labels(query.get("labelSelector", "")),
            fields=parse_fields(query.get("fieldSelector", ""), rt.field_labels),
        )

    def matches(self, obj: dict[str, Any]) -> bool:
        if self.namespace and (obj.get("metadata") or {}).get("namespace") != self.namespace:
            return False
        if self.labels is not None and not self.labels(obj):
            return False
        return self.fields is None or self.fields(obj)


def matching(store: Store, rt: ResourceType, selection: Selection) -> Iterator[dict[str, Any]]:
    """Objects of `rt` (in its version's shape) that match, in key order."""
    for obj in store.items(rt.storage, selection.namespace or None):
        shown = view(obj, rt)
        if selection.matches(shown):
            yield shown


def _decode_continue(token: str) -> tuple[str, str]:
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode()))
        return str(data["start"][0]), str(data["start"][1])
    except (ValueError, KeyError, IndexError, TypeError, binascii.Error) as exc:
        raise errors.bad_request(f"invalid continue token: {token!r}") from exc


def _encode_continue(rv: int, key: tuple[str, str]) -> str:
    raw = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": list(key)})
    return base64.urlsafe_b64encode(raw.encode()).decode()


def list_body(
    store: Store, rt: ResourceType, selection: Selection, *, limit: int = 0, token: str = ""
) -> dict[str, Any]:
    """A `<Kind>List` body; items omit apiVersion/kind like kube's typed lists."""
    after = _decode_continue(token) if token else None
    items: list[dict[str, Any]] = []
    meta: dict[str, Any] = {"resourceVersion": str(store.rv)}
    remaining = 0
    for obj in matching(store, rt, selection):
        key = (obj["metadata"].get("namespace") or "", obj["metadata"]["name"])
        if after is not None and key <= after:
            continue
        if limit and len(items) >= limit:
            remaining += 1
            continue
        items.append({k: v for k, v in obj.items() if k not in ("apiVersion", "kind")})
    if remaining:
        last = items[-1]["metadata"]
        meta["continue"] = _encode_continue(store.rv, (last.get("namespace") or "", last["name"]))
        meta["remainingItemCount"] = remaining
    return {"kind": rt.list_kind, "apiVersion": rt.api_version, "metadata": meta, "items": items}
