"""The aiohttp application: control routes, the catch-all Kubernetes route, and the
middleware that authenticates, logs, injects faults and renders `APIError` as Status.
"""

from __future__ import annotations

import asyncio
import time

import structlog
from aiohttp import web
from aiohttp.typedefs import Handler

from devcluster.apiserver import control, errors, handlers, routing, tokens
from devcluster.apiserver.cluster import Cluster
from devcluster.apiserver.handlers import CLUSTER, CUT_WATCH, INFO
from devcluster.apiserver.requestlog import RequestRecord

__all__ = ["build_app"]

log = structlog.get_logger(__name__)
_OPEN_PATHS = frozenset({"/version", "/healthz", "/readyz", "/livez"})


def _authorized(cluster: Cluster, request: web.Request) -> bool:
    token = cluster.config.token
    if token is None or request.path in _OPEN_PATHS:
        return True
    return request.headers.get("Authorization", "") == f"Bearer {token}"


@web.middleware
async def _middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.path.startswith("/_emulator/"):
        return await handler(request)
    cluster = request.app[CLUSTER]
    query = dict(request.query)
    info = routing.parse(
        request.method, request.path, query, namespaced_plurals=cluster.namespaced_paths
    )
    request[INFO] = info
    record = RequestRecord(
        method=request.method, path=request.path, query=query, verb=info.verb,
        resource=info.resource, subresource=info.subresource, namespace=info.namespace,
        name=info.name, timestamp=time.time(),
    )  # fmt: skip
    cluster.request_log.append(record)
    started = time.monotonic()
    try:
        response = await _handle(cluster, request, handler, info, record)
    finally:
        record.duration_s = time.monotonic() - started
    record.status = response.status
    return response


async def _handle(
    cluster: Cluster, request: web.Request, handler: Handler, info: routing.RequestInfo,
    record: RequestRecord,
) -> web.StreamResponse:  # fmt: skip
    try:
        if not _authorized(cluster, request):
            raise errors.APIError(401, "Unauthorized", "Unauthorized")
        decision = cluster.faults.decide(info)
        if decision.latency_s:
            await asyncio.sleep(decision.latency_s)
        if decision.error is not None:
            record.fault = True
            rule = decision.error
            raise errors.status_for_code(
                rule.status or 500, rule.message, retry_after_s=rule.retry_after_s
            )
        if decision.cut_watch_after_s is not None:
            request[CUT_WATCH] = decision.cut_watch_after_s
        return await handler(request)
    except errors.APIError as exc:
        return handlers.json_response(exc.status(), status=exc.code, headers=exc.headers)
    except Exception as exc:  # the per-request boundary: a bug answers 500, like kube
        log.exception("request_failed", path=request.path)
        failure = errors.APIError(500, "InternalError", f"Internal error occurred: {exc}")
        return handlers.json_response(failure.status(), status=500)


def build_app(cluster: Cluster) -> web.Application:
    app = web.Application(middlewares=[_middleware], client_max_size=64 * 1024 * 1024)
    app[CLUSTER] = cluster
    app.add_routes(control.routes())
    app.add_routes(tokens.routes())
    app.router.add_route("*", "/{tail:.*}", handlers.dispatch)
    return app
