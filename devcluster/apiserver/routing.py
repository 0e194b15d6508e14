"""Parsing kube REST paths into what a request is about (`RequestInfo`), like kube's.

`/apis/<group>/<version>[/namespaces/<ns>]/<plural>[/<name>[/<subresource>]]` and the
core `/api/v1/...` form. Resolving the plural against the registry happens in the handlers.
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from dataclasses import dataclass

__all__ = ["RequestInfo", "flag", "parse"]

_TRUE = frozenset({"1", "t", "T", "true", "TRUE", "True"})


@dataclass(frozen=True, slots=True)
class RequestInfo:
    method: str
    verb: str
    """get, list, watch, create, update, patch, delete, deletecollection (resource paths)."""
    group: str = ""
    version: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""

    @property
    def is_resource(self) -> bool:
        return bool(self.resource)


def _verb(method: str, *, named: bool, watch: bool) -> str:
    if method in ("GET", "HEAD"):
        return "get" if named else ("watch" if watch else "list")
    if method == "DELETE":
        return "delete" if named else "deletecollection"
    return {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, method.lower())


def parse(
    method: str,
    path: str,
    query: Mapping[str, str],
    *,
    namespaced_plurals: Container[tuple[str, str, str]],
) -> RequestInfo:
    """`namespaced_plurals` holds (group, version, plural) of namespaced resources, so that
    `/api/v1/namespaces/<ns>/<plural>` is told apart from `/api/v1/namespaces/<name>/status`."""
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 2 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return RequestInfo(method=method, verb=method.lower())
    if not rest:
        return RequestInfo(method=method, verb="get", group=group, version=version)
    namespace = ""
    if (
        len(rest) >= 3
        and rest[0] == "namespaces"
        and (group, version, rest[2]) in namespaced_plurals
    ):
        namespace, rest = rest[1], rest[2:]
    resource, name, subresource = rest[0], "", ""
    if len(rest) >= 2:
        name = rest[1]
    if len(rest) >= 3:
        subresource = "/".join(rest[2:])
    watch = query.get("watch", "") in _TRUE
    verb = _verb(method, named=bool(name), watch=watch)
    return RequestInfo(method, verb, group, version, resource, subresource, namespace, name)


def flag(query: Mapping[str, str], key: str) -> bool:
    """A boolean query parameter parsed like Go's strconv.ParseBool."""
    return query.get(key, "") in _TRUE
