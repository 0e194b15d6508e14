"""Test-control endpoints under `/_emulator`: request log, fault rules, cutting watches.

GET/DELETE /_emulator/requests, GET/POST/DELETE /_emulator/faults,
POST /_emulator/watches/close. Not part of the Kubernetes API; never logged.
"""

from __future__ import annotations

from aiohttp import web

from devcluster.apiserver.faults import FaultRule
from devcluster.apiserver.handlers import CLUSTER, json_response

__all__ = ["routes"]


async def _requests(request: web.Request) -> web.Response:
    log = request.app[CLUSTER].request_log
    q = request.query
    records = log.records(
        verb=q.get("verb"), resource=q.get("resource"), name=q.get("name"), method=q.get("method")
    )
    return json_response({"items": [r.to_dict() for r in records]})


async def _clear_requests(request: web.Request) -> web.Response:
    request.app[CLUSTER].request_log.clear()
    return json_response({"cleared": True})


async def _faults(request: web.Request) -> web.Response:
    return json_response({"items": [r.to_dict() for r in request.app[CLUSTER].faults.rules]})


async def _add_faults(request: web.Request) -> web.Response:
    faults = request.app[CLUSTER].faults
    try:
        body = await request.json()
        specs = body if isinstance(body, list) else [body]
        rules = [FaultRule.from_dict(spec) for spec in specs]
    except (ValueError, TypeError) as exc:
        return json_response({"error": str(exc)}, status=400)
    added = [faults.add(rule).to_dict() for rule in rules]
    return json_response({"items": added}, status=201)


async def _clear_faults(request: web.Request) -> web.Response:
    faults = request.app[CLUSTER].faults
    if "id" in request.query:
        return json_response({"removed": faults.remove(int(request.query["id"]))})
    faults.clear()
    return json_response({"cleared": True})


async def _close_watches(request: web.Request) -> web.Response:
    return json_response({"closed": request.app[CLUSTER].store.close_watches()})


def routes() -> list[web.RouteDef]:
    return [
        web.get("/_emulator/requests", _requests),
        web.delete("/_emulator/requests", _clear_requests),
        web.get("/_emulator/faults", _faults),
        web.post("/_emulator/faults", _add_faults),
        web.delete("/_emulator/faults", _clear_faults),
        web.post("/_emulator/watches/close", _close_watches),
    ]
