"""The shipped alert rules and the health agent's webhook, against real Prometheus and
Alertmanager processes and the three live agents.

Prometheus (Debian's 2.x) scrapes the local stack every second and evaluates the shipped rule
file as it is, plus a copy without `for:` whose alerts carry `rules=short-for` (the shipped
`for:` of minutes is covered by test_alert_rules.py). It sends its alerts to a real
Alertmanager, which the health agent also posts its per-device alerts to
(`--alert-webhook-url`). A fault flow then walks every rule: the allocation agent waits for the
kubelet (not ready), a prepare fails, a device faults (unhealthy, tainted) and recovers, NATS
dies and comes back, an agent is killed. Each alert of the copy fires and, where the fault
ends, resolves; each shipped rule is pending (or firing) at the same time.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from devcluster import flow
from devcluster.kubelet import KubeletClaim, KubeletEmulator
from devcluster.natsserver import NATSServerProcess
from devcluster.stack import AGENTS, LocalStack, StackConfig
from services.health.webhook import ALERTNAME
from shared.bus.session import open_bus
from tests.integration.observability.promstack import (
    RULE_COPY_LABEL,
    RULES,
    Alertmanager,
    Binaries,
    Prometheus,
    short_for_copy,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]

DRIVER = "sim.dra-suite.io"
NODE = "alert-node"
DEVICE = "npu-0"
COPY = {RULE_COPY_LABEL[0]: RULE_COPY_LABEL[1]}
SHIPPED_RULES = sum(
    len(group["rules"]) for group in yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]
)
"""The shipped rule file's rules; Prometheus here loads them and their short-`for:` copy."""
T = TypeVar("T")


@dataclass
class Monitoring:
    stack: LocalStack
    prometheus: Prometheus
    alertmanager: Alertmanager

    async def alerts(self, name: str, *, copy: bool, **labels: str) -> list[dict[str, Any]]:
        """Prometheus's alerts `name` of the copy (or of the shipped rules) with `labels`."""
        want = {"alertname": name, **labels}
        found = []
        for alert in await self.prometheus.alerts():
            have = alert["labels"]
            if (have.get(RULE_COPY_LABEL[0]) == RULE_COPY_LABEL[1]) != copy:
                continue
            if all(have.get(k) == v for k, v in want.items()):
                found.append(alert)
        return found

    async def until_firing(self, name: str, **labels: str) -> dict[str, Any]:
        """The copy's alert fires and the shipped rule's is pending or firing."""

        async def firing() -> dict[str, Any] | None:
            copies = await self.alerts(name, copy=True, **labels)
            shipped = await self.alerts(name, copy=False, **labels)
            fired = [a for a in copies if a["state"] == "firing"]
            if fired and shipped and shipped[0]["state"] in ("pending", "firing"):
                return fired[0]
            return None

        return await _eventually(firing, f"{name}{labels} firing (copy), pending (shipped)")

    async def until_resolved(self, name: str, **labels: str) -> None:
        async def gone() -> bool:
            return not await self.alerts(name, copy=True, **labels)

        await _eventually(gone, f"{name}{labels} resolved")

    async def until_in_alertmanager(self, **labels: str) -> dict[str, Any]:
        async def active() -> dict[str, Any] | None:
            found = await self.alertmanager.alerts(**labels)
            return next((a for a in found if a["status"]["state"] == "active"), None)

        return await _eventually(active, f"{labels} active in Alertmanager")

    async def until_gone_from_alertmanager(self, **labels: str) -> None:
        async def gone() -> bool:
            return not await self.alertmanager.alerts(**labels)

        await _eventually(gone, f"{labels} resolved in Alertmanager")


async def _eventually(probe: Callable[[], Awaitable[T | None]], what: str) -> T:
    return await flow.eventually(probe, what=what, timeout_s=45)


@pytest.fixture
async def monitoring(binaries: Binaries, short_tmp: Path) -> AsyncIterator[Monitoring]:
    alertmanager = Alertmanager(binaries.alertmanager, short_tmp / "alertmanager")
    prometheus: Prometheus | None = None
    try:
        await alertmanager.start()
        webhook = ("--alert-webhook-url", f"{alertmanager.url}/api/v2/alerts")
        config = StackConfig(
            workdir=short_tmp / "stack", node_name=NODE, extra_args=(("health", webhook),)
        )
        async with LocalStack(config) as stack:
            prometheus = Prometheus(
                binaries.prometheus,
                short_tmp / "prometheus",
                targets=[f"127.0.0.1:{stack.ops_port(agent)}" for agent in AGENTS],
                rule_files=[RULES, short_for_copy(RULES, short_tmp / "short-for.yaml")],
                alertmanager=alertmanager.address,
            )
            await prometheus.start()
            yield Monitoring(stack, prometheus, alertmanager)
    finally:
        if prometheus is not None:
            await prometheus.stop()
        await alertmanager.stop()


async def _claim(stack: LocalStack) -> KubeletClaim:
    async with stack.kube() as kube:
        await flow.wait_slices(kube, driver=DRIVER, node=NODE, devices=12)
        await flow.create_device_class(
            kube, name="npu.sim.dra-suite.io", cel=f'device.attributes["{DRIVER}"].type == "npu"'
        )
        claim = await flow.create_claim(
            kube,
            namespace="default",
            name="good",
            device_class="npu.sim.dra-suite.io",
            count=1,
            cel="true",
        )
        return flow.kubelet_claim(await flow.schedule_claim(kube, claim, node=NODE))


async def test_every_rule_fires_in_a_fault_flow_and_alerts_reach_alertmanager(
    monitoring: Monitoring,
) -> None:
    stack, prometheus = monitoring.stack, monitoring.prometheus
    assert (await prometheus.version()).startswith("2.")

    # Both rule files loaded and every rule evaluates without error.
    groups = await _eventually(prometheus.rule_groups, "rule groups loaded")
    assert {g["name"] for g in groups} == {"dra-suite", "dra-suite-short-for"}

    async def healthy_rules() -> bool:
        rules = [rule for group in await prometheus.rule_groups() for rule in group["rules"]]
        return len(rules) == 2 * SHIPPED_RULES and all(rule["health"] == "ok" for rule in rules)

    await _eventually(healthy_rules, f"all {2 * SHIPPED_RULES} rules evaluated, health ok")

    # Agent not ready: the allocation agent waits for the kubelet's registration.
    await monitoring.until_firing("DRAAgentNotReady", service_name="dra-allocation")
    kubelet = KubeletEmulator(stack.config.registry_dir)
    try:
        await kubelet.register(driver=DRIVER)
        await monitoring.until_resolved("DRAAgentNotReady", service_name="dra-allocation")

        # Prepare errors: a claim the API server does not have fails; a real one prepares.
        good = await _claim(stack)
        missing = KubeletClaim(namespace="default", name="missing", uid=str(uuid.uuid4()))
        answers = await kubelet.prepare([good, missing])
        assert not answers.claims[good.uid].error
        assert answers.claims[missing.uid].error
        fired = await monitoring.until_firing("DRAPrepareErrors", k8s_node_name=NODE)
        assert fired["labels"]["dra_driver_name"] == DRIVER
    finally:
        await kubelet.close()

    # A device fault: unhealthy and tainted (Prometheus), the webhook's per-device alert and
    # Prometheus's own alerts active in Alertmanager; then the fault clears and all resolve.
    async with open_bus(stack.nats_settings) as bus:
        await flow.inject_fault(bus, driver=DRIVER, node=NODE, device=DEVICE)
        unhealthy = await monitoring.until_firing("DRAUnhealthyDevices", health="unhealthy")
        assert unhealthy["labels"]["k8s_node_name"] == NODE
        assert float(unhealthy["value"]) == 1
        await monitoring.until_firing("DRADevicesTainted", effect="NoSchedule")
        webhook = await monitoring.until_in_alertmanager(alertname=ALERTNAME, device=DEVICE)
        assert webhook["labels"]["node"] == NODE
        assert webhook["labels"]["cause"] == "injected"
        assert webhook["annotations"]["taint"].endswith(":NoSchedule")
        await monitoring.until_in_alertmanager(alertname="DRAUnhealthyDevices", **COPY)

        await flow.inject_fault(bus, driver=DRIVER, node=NODE, device=DEVICE, clear=True)
        await monitoring.until_gone_from_alertmanager(alertname=ALERTNAME, device=DEVICE)
        await monitoring.until_resolved("DRAUnhealthyDevices")
        await monitoring.until_resolved("DRADevicesTainted")
        await monitoring.until_gone_from_alertmanager(alertname="DRAUnhealthyDevices", **COPY)

    # NATS dies: every agent reports the lost connection; it comes back and they reconnect.
    nats = stack.nats
    assert isinstance(nats, NATSServerProcess)
    await asyncio.to_thread(nats.kill)
    for agent in AGENTS:
        await monitoring.until_firing("DRANATSDisconnected", service_name=f"dra-{agent}")
    await asyncio.to_thread(nats.start)
    await monitoring.until_resolved("DRANATSDisconnected")

    async def reconnected() -> bool:
        counted = await prometheus.query("dra_nats_reconnects_total > 0")
        return len(counted) == len(AGENTS)

    await _eventually(reconnected, "dra_nats_reconnects_total counted by every agent")

    # An agent down: its scrape fails (up == 0), known from its target_info of the last hour.
    await stack.kill_agent("discovery")
    down = await monitoring.until_firing("DRAAgentNotReady", service_name="dra-discovery")
    assert down["labels"]["k8s_node_name"] == NODE
