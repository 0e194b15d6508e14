"""Every agent's ops endpoint, scraped from the real processes while the flow runs:
/healthz and /readyz answer, and /metrics follows what happens (slice writes, prepares,
unhealthy devices, alerts)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from devcluster import flow
from devcluster.kubelet import KubeletEmulator
from devcluster.stack import AGENTS, LocalStack, StackConfig
from shared.bus.session import open_bus

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

DRIVER = "sim.dra-suite.io"
NODE = "ops-node"


@pytest.fixture
async def stack(short_tmp: Path) -> AsyncIterator[LocalStack]:
    async with LocalStack(StackConfig(workdir=short_tmp / "stack", node_name=NODE)) as running:
        yield running


async def _get(url: str) -> tuple[int, str]:
    try:
        async with aiohttp.ClientSession() as http, http.get(url) as response:
            return response.status, await response.text()
    except aiohttp.ClientConnectionError:
        return 0, ""


def _sample(text: str, name: str, **labels: str) -> float:
    """The value of one series (0 when absent)."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0


async def _metric(stack: LocalStack, agent: str, name: str, **labels: str) -> float:
    _, text = await _get(stack.ops_url(agent))
    return _sample(text, name, **labels)


async def _until_metric(stack: LocalStack, agent: str, name: str, **labels: str) -> float:
    async def probe() -> float | None:
        value = await _metric(stack, agent, name, **labels)
        return value if value > 0 else None

    return await flow.eventually(probe, what=f"{agent} metric {name}{labels}")


async def _ready(stack: LocalStack, agent: str) -> None:
    async def ready() -> bool | None:
        return (await _get(stack.ops_url(agent, "/readyz")))[0] == 200 or None

    await flow.eventually(ready, what=f"{agent} /readyz")


async def test_probes_and_metrics_follow_the_flow(stack: LocalStack):
    for agent in AGENTS:
        if agent == "allocation":
            # Ready only once the kubelet registered the plugin (below).
            async def waiting() -> str | None:
                status, text = await _get(stack.ops_url("allocation", "/readyz"))
                return text if status == 503 and "registration" in text else None

            await flow.eventually(waiting, what="allocation /readyz waiting for registration")
        else:
            await _ready(stack, agent)
        assert await _get(stack.ops_url(agent, "/healthz")) == (200, "ok\n")

    slice_creates = await _until_metric(
        stack, "discovery", "dra_kube_requests_total", verb="create", resource="resourceslices"
    )
    assert slice_creates >= 1

    async with open_bus(stack.nats_settings) as bus, stack.kube() as kube:
        await flow.wait_slices(kube, driver=DRIVER, node=NODE, devices=12)
        await flow.create_device_class(
            kube, name="npu.sim.dra-suite.io", cel=f'device.attributes["{DRIVER}"].type == "npu"'
        )
        claim = await flow.create_claim(
            kube,
            namespace="default",
            name="one",
            device_class="npu.sim.dra-suite.io",
            count=1,
            cel="true",
        )
        claim = await flow.schedule_claim(kube, claim, node=NODE)
        kubelet = KubeletEmulator(stack.config.registry_dir)
        try:
            await kubelet.register(driver=DRIVER)
            await _ready(stack, "allocation")
            await kubelet.prepare([flow.kubelet_claim(claim)])
        finally:
            await kubelet.close()
        assert (
            await _until_metric(
                stack, "allocation", "dra_prepare_duration_seconds_count", outcome="ok"
            )
            == 1
        )
        assert await _metric(stack, "allocation", "dra_prepared_claims") == 1

        await flow.inject_fault(bus, driver=DRIVER, node=NODE, device="npu-0")
        assert await _until_metric(stack, "health", "dra_devices", health="unhealthy") == 1
        assert (
            await _until_metric(stack, "health", "dra_alerts_published_total", status="raised") == 1
        )
        assert (
            await _metric(
                stack,
                "health",
                "dra_kube_requests_total",
                verb="create",
                resource="devicetaintrules",
            )
            >= 1
        )
