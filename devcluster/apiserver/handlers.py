"""HTTP handlers for the Kubernetes REST paths: resources, subresources and discovery.

Each handler resolves the request against the registry, delegates to `operations`
or `query`, and answers JSON. Failures are raised as `APIError` and rendered by
the middleware in `app`.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from devcluster.apiserver import discovery, errors
from devcluster.apiserver.cluster import Cluster
from devcluster.apiserver.conversion import view
from devcluster.apiserver.operations import MERGE_TYPES
from devcluster.apiserver.query import Selection, list_body
from devcluster.apiserver.registry import ResourceType
from devcluster.apiserver.routing import RequestInfo, flag
from devcluster.apiserver.watch import WatchOptions, stream

__all__ = ["CLUSTER", "CUT_WATCH", "INFO", "dispatch", "json_response"]

CLUSTER = web.AppKey("cluster", Cluster)
INFO = web.RequestKey("info", RequestInfo)
CUT_WATCH = web.RequestKey("cut_watch_after_s", float)
_NOT_FOUND = "the server could not find the requested resource"


def json_response(
    body: Any, *, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    text = json.dumps(body, separators=(",", ":"))
    return web.Response(text=text, status=status, content_type="application/json", headers=headers)


async def dispatch(request: web.Request) -> web.StreamResponse:
    cluster = request.app[CLUSTER]
    info = request[INFO]
    if not info.is_resource:
        return _discovery(cluster, request.path, info)
    rt = cluster.registry.lookup(info.group, info.version, info.resource)
    if rt is None or (rt.namespaced and not info.namespace and info.verb not in ("list", "watch")):
        raise errors.APIError(404, "NotFound", _NOT_FOUND)
    if info.subresource:
        if info.subresource != "status" or not rt.status_subresource:
            raise errors.APIError(404, "NotFound", _NOT_FOUND)
        if info.verb not in ("get", "update", "patch"):
            raise errors.method_not_allowed(info.method)
    return await _verb(request, cluster, info, rt)


async def _verb(
    request: web.Request, cluster: Cluster, info: RequestInfo, rt: ResourceType
) -> web.StreamResponse:
    ops, ns, name, query = cluster.operations, info.namespace, info.name, request.query
    status = info.subresource == "status"
    match info.verb:
        case "get":
            return json_response(view(ops.current(rt, ns, name), rt))
        case "list":
            selection = Selection.from_query(rt, ns or None, query)
            limit = int(query.get("limit", "0") or 0)
            body = list_body(
                cluster.store, rt, selection, limit=limit, token=query.get("continue", "")
            )
            return json_response(body)
        case "watch":
            return await _watch(request, cluster, rt, ns)
        case "create":
            obj = ops.create(rt, ns, await _json_body(request))
            return json_response(view(obj, rt), status=201)
        case "update":
            obj = ops.update(rt, ns, name, await _json_body(request), status=status)
            return json_response(view(obj, rt))
        case "patch":
            return await _patch(request, cluster, info, rt)
        case "delete":
            body = await _json_body(request, optional=True)
            obj, deleted = ops.delete(rt, ns, name, body)
            return json_response(view(obj, rt), status=200 if deleted else 202)
        case "deletecollection":
            selection = Selection.from_query(rt, ns or None, query)
            return json_response(_delete_collection(cluster, rt, selection))
    raise errors.method_not_allowed(info.method)


async def _patch(
    request: web.Request, cluster: Cluster, info: RequestInfo, rt: ResourceType
) -> web.Response:
    content_type = request.content_type
    if content_type == "application/apply-patch+yaml":
        body: Any = await request.read()
    elif content_type in (*MERGE_TYPES, "application/json-patch+json"):
        body = await _json_body(request)
    else:
        raise errors.unsupported_media_type(content_type)
    obj = cluster.operations.patch(
        rt, info.namespace, info.name, body, content_type=content_type,
        status=info.subresource == "status", field_manager=request.query.get("fieldManager"),
    )  # fmt: skip
    return json_response(view(obj, rt))


def _delete_collection(cluster: Cluster, rt: ResourceType, selection: Selection) -> dict[str, Any]:
    body = list_body(cluster.store, rt, selection)
    deleted = []
    for item in body["items"]:
        meta = item["metadata"]
        obj, _ = cluster.operations.delete(rt, meta.get("namespace") or "", meta["name"])
        deleted.append({k: v for k, v in view(obj, rt).items() if k not in ("apiVersion", "kind")})
    body["items"] = deleted
    body["metadata"] = {"resourceVersion": str(cluster.store.rv)}
    return body


async def _watch(
    request: web.Request, cluster: Cluster, rt: ResourceType, namespace: str
) -> web.StreamResponse:
    query = request.query
    timeout = query.get("timeoutSeconds")
    options = WatchOptions(
        resource_version=query.get("resourceVersion", ""),
        bookmarks=flag(query, "allowWatchBookmarks"),
        send_initial_events=flag(query, "sendInitialEvents"),
        timeout_s=float(timeout) if timeout else None,
        bookmark_interval_s=cluster.config.bookmark_interval_s,
        cut_after_s=request.get(CUT_WATCH),
    )
    selection = Selection.from_query(rt, namespace or None, query)
    return await stream(request, store=cluster.store, rt=rt, selection=selection, options=options)


async def _json_body(request: web.Request, *, optional: bool = False) -> Any:
    raw = await request.read()
    if not raw.strip():
        if optional:
            return None
        raise errors.bad_request("the request body is empty")
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise errors.bad_request(f"error decoding request body: {exc}") from exc


def _discovery(cluster: Cluster, path: str, info: RequestInfo) -> web.Response:
    registry, parts = cluster.registry, [p for p in path.split("/") if p]
    body: dict[str, Any] | None = None
    if parts == ["version"]:
        body = discovery.version_info(cluster.config)
    elif parts == ["api"]:
        body = discovery.api_versions(cluster.server_address)
    elif parts == ["apis"]:
        body = discovery.api_group_list(registry)
    elif len(parts) == 2 and parts[0] == "apis":
        body = discovery.api_group(registry, parts[1])
    elif info.version and len(parts) in (2, 3):
        body = discovery.resource_list(registry, info.group, info.version)
    elif parts and parts[0] in ("healthz", "readyz", "livez"):
        return web.Response(text="ok")
    if body is None:
        raise errors.APIError(404, "NotFound", _NOT_FOUND)
    return json_response(body)
