"""The ops endpoint of an agent: `/metrics` (Prometheus), `/healthz` (liveness), `/readyz`.

`/metrics` answers in OpenMetrics, with the histograms' exemplars, to a scraper that accepts it
(Prometheus does), in the Prometheus text format to any other (`metrics.exposition`). It also
carries the process-level `dra_asyncio_tasks` gauge of the serving loop and `dra_agent_ready`,
the readiness `/readyz` would answer at the time of the scrape.

Liveness answers from the event loop itself, so a wedged loop fails it; named liveness checks
add what else must hold (e.g. the kubelet sockets still exist). Readiness is the agent's `ready`
event plus its readiness checks. NATS being down fails neither: agents serve without it.
Readiness notes are details that do not fail it (a device left out of the slices): each
note that has something to say adds a line to the answer, after `ok` or the failures.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

import structlog
from aiohttp import web

from shared import metrics
from shared.config import OpsSettings
from shared.errors import ConfigError

__all__ = ["Check", "OpsServer", "open_ops_server"]

log = structlog.get_logger(__name__)

# A check returns None when it holds, else a short reason.
Check = Callable[[], Awaitable[str | None]]


@dataclass
class OpsServer:
    host: str
    port: int
    ready: asyncio.Event
    liveness: Mapping[str, Check] = field(default_factory=dict)
    readiness: Mapping[str, Check] = field(default_factory=dict)
    notes: Mapping[str, Check] = field(default_factory=dict)
    """Readiness details that never fail it: `name: text` lines under the status."""
    _runner: web.AppRunner | None = None
    bound_port: int = 0

    async def start(self) -> None:
        metrics.observe_asyncio_tasks(asyncio.get_running_loop())
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise ConfigError(
                f"ops server cannot listen on {self.host}:{self.port}: {exc}", field="ops_port"
            ) from exc
        self._runner = runner
        self.bound_port = runner.addresses[0][1]
        log.info("ops_server_started", host=self.host, port=self.bound_port)

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def _metrics(self, request: web.Request) -> web.Response:
        # `dra_agent_ready`: what /readyz would answer now, for alerts on agents not ready.
        metrics.report_ready(self.ready.is_set() and not await _outcomes(self.readiness))
        accept = request.headers.get("Accept", "")
        body, content_type = await asyncio.to_thread(metrics.exposition, accept)
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def _healthz(self, _: web.Request) -> web.Response:
        return await _answer(self.liveness)

    async def _readyz(self, _: web.Request) -> web.Response:
        if not self.ready.is_set():
            return web.Response(status=503, text="not ready: agent starting or stopping\n")
        return await _answer(self.readiness, notes=self.notes)


async def _outcomes(checks: Mapping[str, Check]) -> list[str]:
    """`name: reason` of every check that has something to say."""
    found = []
    for name, check in checks.items():
        try:
            async with asyncio.timeout(2.0):
                reason = await check()
        except TimeoutError:
            reason = "check timed out"
        if reason is not None:
            found.append(f"{name}: {reason}")
    return found


async def _answer(
    checks: Mapping[str, Check], *, notes: Mapping[str, Check] | None = None
) -> web.Response:
    failures = await _outcomes(checks)
    details = await _outcomes(notes or {})
    if failures:
        return web.Response(status=503, text="\n".join(failures + details) + "\n")
    return web.Response(text="\n".join(["ok", *details]) + "\n")


async def open_ops_server(
    settings: OpsSettings,
    resources: contextlib.AsyncExitStack,
    *,
    ready: asyncio.Event,
    liveness: Mapping[str, Check] | None = None,
    readiness: Mapping[str, Check] | None = None,
    notes: Mapping[str, Check] | None = None,
) -> OpsServer | None:
    """Start the agent's ops server (none when the port is 0) and register its stop."""
    if not settings.ops_port:
        return None
    server = OpsServer(
        host=settings.ops_host,
        port=settings.ops_port,
        ready=ready,
        liveness=dict(liveness or {}),
        readiness=dict(readiness or {}),
        notes=dict(notes or {}),
    )
    await server.start()
    resources.push_async_callback(server.stop)
    return server
