"""The shipped Grafana dashboard against a real Prometheus scraping the three live agents.

The local stack (nats-server, the API emulator, discovery, allocation and health as processes,
as the e2e tests run it) is scraped every second by Debian's Prometheus. Every query of
deploy/compose/grafana/dashboards/dra-suite.json, with `$node` as Grafana's "All" and as the
node's name, must return series: those that need no event (NATS reconnects, API-server errors,
alerts, devices, slice writes, claims) from the start, the rest once a claim was prepared and
unprepared and a device faulted. The `node` variable's query finds the node; the device-health
labels the dashboard names are those the health agent exports. Prometheus stores exemplars
(`--enable-feature=exemplar-storage`, as in the compose stack): each target that shows them
finds them once the prepares ran (every agent traces, exported or not).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from devcluster import flow
from devcluster.kubelet import KubeletEmulator
from devcluster.stack import AGENTS, LocalStack, StackConfig
from shared.bus.session import open_bus
from tests.integration.observability.promstack import Binaries, Prometheus

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(180)]

REPO = Path(__file__).resolve().parents[3]
DASHBOARD = REPO / "deploy/compose/grafana/dashboards/dra-suite.json"
DRIVER = "sim.dra-suite.io"
NODE = "obs-node"
DEVICE_CLASS = "npu.sim.dra-suite.io"
NEEDS_AN_EVENT = {
    "Prepare latency p50 / p99 (s)": "a prepare",
    "Prepares and unprepares per second, by outcome": "a prepare and an unprepare",
    "Taint rule writes per minute": "a taint",
}
"""Panels whose series start with the event they count (a histogram has no zero series)."""


def _panels() -> list[dict[str, Any]]:
    panels: list[dict[str, Any]] = json.loads(DASHBOARD.read_text(encoding="utf-8"))["panels"]
    return panels


def _queries() -> list[tuple[str, str]]:
    return [(panel["title"], t["expr"]) for panel in _panels() for t in panel["targets"]]


@pytest.fixture
async def stack(binaries: Binaries, short_tmp: Path) -> AsyncIterator[LocalStack]:
    async with LocalStack(StackConfig(workdir=short_tmp / "stack", node_name=NODE)) as running:
        yield running


@pytest.fixture
async def prometheus(
    binaries: Binaries, stack: LocalStack, short_tmp: Path
) -> AsyncIterator[Prometheus]:
    server = Prometheus(
        binaries.prometheus,
        short_tmp / "prometheus",
        targets=[f"127.0.0.1:{stack.ops_port(agent)}" for agent in AGENTS],
        flags=("--enable-feature=exemplar-storage",),
    )
    try:
        await server.start()
        yield server
    finally:
        await server.stop()


async def _all_targets_up(prometheus: Prometheus) -> None:
    async def up() -> bool:
        health = await prometheus.targets_health()
        return len(health) == len(AGENTS) and set(health.values()) == {"up"}

    await flow.eventually(up, what="every agent scraped", timeout_s=30)


async def _missing(prometheus: Prometheus, queries: list[tuple[str, str]], node: str) -> list[str]:
    """The queries (panel: expr) that return no series with `$node` = `node`."""
    missing = []
    for title, expr in queries:
        if not await prometheus.query(expr.replace("$node", node)):
            missing.append(f"{title}: {expr}")
    return missing


async def _until_every_query_has_series(
    prometheus: Prometheus, queries: list[tuple[str, str]], *, timeout_s: float = 30.0
) -> None:
    left: list[str] = []

    async def answered() -> bool:
        nonlocal left
        left = [
            *await _missing(prometheus, queries, ".*"),
            *await _missing(prometheus, queries, NODE),
        ]
        return not left

    try:
        await flow.eventually(answered, what="series for every query", timeout_s=timeout_s)
    except flow.FlowError as exc:
        raise AssertionError(f"{exc}; without series: {left}") from None


async def _prepare_and_unprepare(stack: LocalStack) -> None:
    """Two claims prepared a few scrapes apart (so the latency rate is not 0), one unprepared."""
    async with stack.kube() as kube:
        await flow.wait_slices(kube, driver=DRIVER, node=NODE, devices=12)
        await flow.create_device_class(
            kube, name=DEVICE_CLASS, cel=f'device.attributes["{DRIVER}"].type == "npu"'
        )
        claims = []
        for name in ("first", "second"):
            claim = await flow.create_claim(
                kube, namespace="default", name=name, device_class=DEVICE_CLASS, count=1, cel="true"
            )
            claims.append(flow.kubelet_claim(await flow.schedule_claim(kube, claim, node=NODE)))
    kubelet = KubeletEmulator(stack.config.registry_dir)
    try:
        await kubelet.register(driver=DRIVER)
        first, second = claims
        await kubelet.prepare([first])
        await asyncio.sleep(2.5)
        await kubelet.prepare([second])
        await kubelet.unprepare([first])
    finally:
        await kubelet.close()


async def test_every_dashboard_query_returns_series_from_the_live_agents(
    stack: LocalStack, prometheus: Prometheus
) -> None:
    assert (await prometheus.version()).startswith("2."), "the dashboard is checked on 2.x"
    await _all_targets_up(prometheus)
    queries = _queries()
    assert len(queries) == 11, [title for title, _ in queries]

    # Before anything happened: the counters of quiet dependencies exist at 0.
    quiet = [(title, expr) for title, expr in queries if title not in NEEDS_AN_EVENT]
    await _until_every_query_has_series(prometheus, quiet)
    for title, expr in quiet:
        if title.startswith(("NATS reconnects", "API server errors")):
            values = {
                float(s["value"][1]) for s in await prometheus.query(expr.replace("$node", ".*"))
            }
            assert values == {0.0}, (title, values)

    # The node variable lists the node; filtering by it keeps every series.
    variable = next(v for v in json.loads(DASHBOARD.read_text())["templating"]["list"]
                    if v["name"] == "node")  # fmt: skip
    match = re.fullmatch(r"label_values\((.+), (\w+)\)", variable["query"]["query"])
    assert match is not None, variable["query"]
    assert await prometheus.label_values(match.group(2), match.group(1)) == [NODE]

    # The device-health values the dashboard names are those the health agent exports:
    # unmonitored devices are `unknown` (shown as "unknown (unmonitored)").
    health = {s["metric"]["health"] for s in await prometheus.query("dra_devices")}
    assert health == {"healthy", "unhealthy", "unknown"}
    (panel,) = [p for p in _panels() if "dra_devices" in p["targets"][0]["expr"]]
    assert panel["targets"][0]["legendFormat"] == "{{health}}"
    named = {o["matcher"]["options"] for o in panel["fieldConfig"]["overrides"]}
    assert "unknown" in named
    assert named <= health, named - health

    # Events: prepares, an unprepare, a device fault (taint rule written, alert raised).
    await _prepare_and_unprepare(stack)
    async with open_bus(stack.nats_settings) as bus:
        await flow.inject_fault(bus, driver=DRIVER, node=NODE, device="npu-0")
    await _until_every_query_has_series(prometheus, queries)

    (p50,) = await prometheus.query(queries[0][1].replace("$node", ".*"))
    assert float(p50["value"][1]) > 0, "two prepares a few scrapes apart give a latency"

    # What Grafana asks for a target that shows exemplars: its expression's exemplars.
    with_exemplars = [t["expr"] for p in _panels() for t in p["targets"] if t.get("exemplar")]
    assert with_exemplars
    for expr in with_exemplars:
        for node in (".*", NODE):
            found = await prometheus.exemplars(expr.replace("$node", node))
            assert [e for series in found for e in series["exemplars"]], (expr, node)
