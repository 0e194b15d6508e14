"""The ops endpoint over real HTTP: Prometheus metrics, liveness and readiness checks."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest

from shared import metrics
from shared.opsserver import OpsServer


class _Flag:
    """A check whose answer the test sets."""

    def __init__(self) -> None:
        self.reason: str | None = None

    async def __call__(self) -> str | None:
        return self.reason


@pytest.fixture
async def ops() -> AsyncIterator[tuple[OpsServer, _Flag, _Flag]]:
    metrics.configure(service="test")
    alive, ready = _Flag(), _Flag()
    server = OpsServer(
        host="127.0.0.1",
        port=0,
        ready=asyncio.Event(),
        liveness={"sockets": alive},
        readiness={"slices": ready},
    )
    await server.start()
    yield server, alive, ready
    await server.stop()


async def _get(server: OpsServer, path: str) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{server.bound_port}{path}") as response,
    ):
        return response.status, await response.text()


async def test_metrics_expose_counters_in_prometheus_format(ops):
    server, _, _ = ops
    counter = metrics.meter("test").create_counter("dra_test_events", unit="1")
    counter.add(3, {"outcome": "ok"})
    status, body = await _get(server, "/metrics")
    assert status == 200
    assert 'dra_test_events_total{outcome="ok"} 3.0' in body


async def test_liveness_fails_with_the_failing_checks_reason(ops):
    server, alive, _ = ops
    assert await _get(server, "/healthz") == (200, "ok\n")
    alive.reason = "dra.sock is gone"
    assert await _get(server, "/healthz") == (503, "sockets: dra.sock is gone\n")


async def test_readiness_needs_the_ready_event_and_every_readiness_check(ops):
    server, _, ready = ops
    status, _ = await _get(server, "/readyz")
    assert status == 503
    server.ready.set()
    ready.reason = "slices not published yet"
    assert await _get(server, "/readyz") == (503, "slices: slices not published yet\n")
    ready.reason = None
    assert await _get(server, "/readyz") == (200, "ok\n")


async def test_readiness_notes_add_detail_lines_without_failing_it():
    ready, note = _Flag(), _Flag()
    server = OpsServer(
        host="127.0.0.1",
        port=0,
        ready=asyncio.Event(),
        readiness={"slices": ready},
        notes={"devices": note},
    )
    server.ready.set()
    await server.start()
    try:
        assert await _get(server, "/readyz") == (200, "ok\n")
        note.reason = "1 device(s) not published"
        assert await _get(server, "/readyz") == (200, "ok\ndevices: 1 device(s) not published\n")
        ready.reason = "rejected"
        assert await _get(server, "/readyz") == (
            503,
            "slices: rejected\ndevices: 1 device(s) not published\n",
        )
    finally:
        await server.stop()
