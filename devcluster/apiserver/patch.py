"""Patch documents: JSON merge patch (RFC 7386, also for strategic merge), JSON patch (RFC 6902).

Both take a private copy of the target (they may mutate it) and a freshly decoded
patch body. Errors raise `APIError`. Pure.
"""

from __future__ import annotations

import copy
from typing import Any

from devcluster.apiserver.errors import APIError, bad_request

__all__ = ["json_patch", "merge_patch"]


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, `null` deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return patch
    result = target if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise bad_request(f"json patch path {path!r} must start with /")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _index(container: list[Any], token: str, *, for_add: bool) -> int:
    if for_add and token == "-":
        return len(container)
    if not token.isdigit():
        raise bad_request(f"json patch: invalid array index {token!r}")
    index = int(token)
    if index > len(container) or (not for_add and index == len(container)):
        raise bad_request(f"json patch: array index {index} out of bounds")
    return index


def _parent(doc: Any, tokens: list[str]) -> Any:
    node = doc
    for token in tokens[:-1]:
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list):
            node = node[_index(node, token, for_add=False)]
        else:
            raise bad_request(f"json patch: path /{'/'.join(tokens)} does not exist")
    return node


def _get(doc: Any, tokens: list[str]) -> Any:
    if not tokens:
        return doc
    parent, last = _parent(doc, tokens), tokens[-1]
    if isinstance(parent, dict) and last in parent:
        return parent[last]
    if isinstance(parent, list):
        return parent[_index(parent, last, for_add=False)]
    raise bad_request(f"json patch: path /{'/'.join(tokens)} does not exist")


def _remove(doc: Any, tokens: list[str]) -> Any:
    parent, last = _parent(doc, tokens), tokens[-1]
    if isinstance(parent, dict) and last in parent:
        return parent.pop(last)
    if isinstance(parent, list):
        return parent.pop(_index(parent, last, for_add=False))
    raise bad_request(f"json patch: cannot remove /{'/'.join(tokens)}: not found")


def _add(doc: Any, tokens: list[str], value: Any) -> Any:
    if not tokens:
        return value
    parent, last = _parent(doc, tokens), tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, last, for_add=True), value)
    else:
        raise bad_request(f"json patch: cannot add at /{'/'.join(tokens)}")
    return doc


def _replace(doc: Any, tokens: list[str], value: Any) -> Any:
    if not tokens:
        return value
    _get(doc, tokens)  # the target must exist
    parent, last = _parent(doc, tokens), tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
    else:
        parent[_index(parent, last, for_add=False)] = value
    return doc


def json_patch(target: dict[str, Any], operations: Any) -> Any:
    """RFC 6902 operations add/remove/replace/move/copy/test."""
    if not isinstance(operations, list):
        raise bad_request("json patch body must be a list of operations")
    doc: Any = target
    for op in operations:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise bad_request(f"json patch: malformed operation {op!r}")
        tokens, kind = _pointer(op["path"]), op["op"]
        if kind == "test":
            if _get(doc, tokens) != op.get("value"):
                raise APIError(422, "Invalid", f"json patch test failed at {op['path']}")
        elif kind == "remove":
            _remove(doc, tokens)
        elif kind == "add":
            doc = _add(doc, tokens, copy.deepcopy(op.get("value")))
        elif kind == "replace":
            doc = _replace(doc, tokens, copy.deepcopy(op.get("value")))
        elif kind in ("move", "copy"):
            source = _pointer(op.get("from", ""))
            value = _remove(doc, source) if kind == "move" else copy.deepcopy(_get(doc, source))
            doc = _add(doc, tokens, value)
        else:
            raise bad_request(f"json patch: unknown operation {kind!r}")
    return doc
