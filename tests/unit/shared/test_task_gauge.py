"""The `dra_asyncio_tasks` gauge on /metrics: the serving loop's unfinished tasks, scraped over
real HTTP (a task leak shows as a gauge that keeps climbing)."""

from __future__ import annotations

import asyncio

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from shared import metrics
from shared.opsserver import OpsServer


async def _tasks_gauge(http: aiohttp.ClientSession, server: OpsServer) -> float:
    async with http.get(f"http://127.0.0.1:{server.bound_port}/metrics") as response:
        text = await response.text()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "dra_asyncio_tasks":
                return float(sample.value)
    raise AssertionError("no dra_asyncio_tasks on /metrics")


async def test_the_gauge_follows_tasks_started_and_finished():
    metrics.configure(service="test")
    server = OpsServer(host="127.0.0.1", port=0, ready=asyncio.Event())
    await server.start()
    try:
        # One session: its kept-alive connection is the same server task in every scrape.
        async with aiohttp.ClientSession() as http:
            before = await _tasks_gauge(http, server)
            assert before >= 1  # at least the task serving this very scrape
            never = asyncio.Event()
            waiting = [asyncio.create_task(never.wait()) for _ in range(5)]
            assert await _tasks_gauge(http, server) == before + 5
            for task in waiting:
                task.cancel()
            await asyncio.gather(*waiting, return_exceptions=True)
            assert await _tasks_gauge(http, server) == before
    finally:
        await server.stop()
