"""Plugin registration against the kubelet emulator over real unix sockets; readiness and
metrics over the agent's real ops endpoint."""

from __future__ import annotations

import socket
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from devcluster.kubelet import KubeletEmulator, KubeletError
from services.allocation.dra.agent import AllocationAgent
from shared import metrics
from shared.config import OpsSettings
from shared.supervisor import run_agent

pytestmark = pytest.mark.integration

DRIVER = "sim.dra-suite.io"


def _ops() -> OpsSettings:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return OpsSettings(ops_host="127.0.0.1", ops_port=port)


async def _get(ops: OpsSettings, path: str) -> tuple[int, str]:
    url = f"http://{ops.ops_host}:{ops.ops_port}{path}"
    async with aiohttp.ClientSession() as http, http.get(url) as response:
        return response.status, await response.text()


async def _metric(ops: OpsSettings, name: str) -> float:
    """The value of an unlabelled series (0 when absent)."""
    _, text = await _get(ops, "/metrics")
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    return 0.0


async def _registration_metrics(ops: OpsSettings) -> dict[str, float]:
    names = (
        "dra_plugin_registered",
        "dra_plugin_registration_rejections_total",
        "dra_plugin_registration_retries_total",
    )
    return {name: await _metric(ops, name) for name in names}


async def test_kubelet_registers_the_plugin_with_v1_first(plugin_node):
    config = plugin_node.config
    async with plugin_node.registered() as (agent, kubelet):
        assert kubelet.info is not None
        assert kubelet.info.type == "DRAPlugin"
        assert kubelet.info.name == "sim.dra-suite.io"
        assert kubelet.info.endpoint == str(config.dra_socket_path)
        assert list(kubelet.info.supported_versions) == [
            "v1.DRAPlugin",
            "v1beta1.DRAPlugin",
            "v1alpha1.DRAResourceHealth",
            "v1.DRAResourceHealth",
        ]
        assert kubelet.dra_version == "v1.DRAPlugin"
        assert agent.registration.registered.is_set()
        for path in (config.dra_socket_path, config.registration_socket_path):
            assert path.is_socket()
            assert path.stat().st_mode & 0o777 == 0o600


async def test_a_rejected_registration_is_recorded_and_the_agent_is_not_ready(plugin_node):
    ops = _ops()
    async with plugin_node.agent(ops=ops) as agent:
        kubelet = KubeletEmulator(
            plugin_node.config.plugin_registry_dir, known_versions=["v2.DRAPlugin"]
        )
        with pytest.raises(KubeletError, match="none of services supported by the plugin"):
            await kubelet.register(driver=DRIVER)
        await kubelet.close()
        assert agent.registration.status is not None
        assert not agent.registration.status.plugin_registered
        assert not agent.registration.registered.is_set()
        status, reason = await _get(ops, "/readyz")
        assert status == 503
        assert reason.startswith("registration: the kubelet rejected the plugin: ")
        assert "none of services supported by the plugin" in reason


async def test_a_rejected_registration_is_retried_on_a_new_socket_until_registered(
    plugin_node: Any,
):
    metrics.configure(service="test")
    ops = _ops()
    async with plugin_node.agent(ops=ops) as agent:
        assert await _get(ops, "/readyz") == (
            503,
            "registration: the kubelet has not registered the plugin yet\n",
        )
        before = await _registration_metrics(ops)
        first_socket = plugin_node.config.registration_socket_path.stat().st_ctime_ns
        # The kubelet records each socket before its DRA handler fails, so it never tries that
        # socket again: only the agent re-creating it brings a second (and third) attempt.
        kubelet = KubeletEmulator(plugin_node.config.plugin_registry_dir, reject_registrations=2)
        try:
            await kubelet.register(driver=DRIVER)
            assert len(kubelet.rejected) == 2
            assert kubelet.info is not None
            assert kubelet.info.endpoint == str(plugin_node.config.dra_socket_path)
            assert agent.registration.rejections == 2
            assert agent.registrar.retries == 2
            assert agent.registration.registered.is_set()
            # Inodes are reused at once: the creation time tells the new socket apart.
            assert plugin_node.config.registration_socket_path.stat().st_ctime_ns > first_socket
            assert plugin_node.config.registration_socket_path.stat().st_mode & 0o777 == 0o600
            assert await _get(ops, "/readyz") == (200, "ok\n")
            after = await _registration_metrics(ops)
            assert after["dra_plugin_registered"] == 1
            assert before["dra_plugin_registered"] == 0
            for counter in (
                "dra_plugin_registration_rejections_total",
                "dra_plugin_registration_retries_total",
            ):
                assert after[counter] - before[counter] == 2
            # Registered for real: the DRA socket answers the kubelet.
            claim = plugin_node.allocate("after-retry", ["npu-0"])
            await plugin_node.publish_inventory("npu-0")
            await plugin_node.eventually(lambda: plugin_node.config.inventory_path.exists())
            answer = await kubelet.prepare([claim])
            assert answer.claims[claim.uid].error == ""
        finally:
            await kubelet.close()


async def test_stopping_the_agent_removes_its_sockets(plugin_node):
    config = plugin_node.config
    async with plugin_node.agent():
        assert config.registration_socket_path.is_socket()
    assert not config.registration_socket_path.exists()
    assert not config.dra_socket_path.exists()


async def test_a_stale_socket_file_is_replaced(plugin_node):
    config = plugin_node.config
    # A killed earlier run leaves its socket file behind.
    config.dra_socket_path.parent.mkdir(parents=True)
    with socket.socket(socket.AF_UNIX) as stale:
        stale.bind(str(config.dra_socket_path))
    async with plugin_node.registered() as (_, kubelet):
        assert kubelet.dra_version == "v1.DRAPlugin"


async def test_a_socket_path_taken_by_a_regular_file_fails_the_agent(plugin_node):
    config = plugin_node.config
    config.registration_socket_path.parent.mkdir(parents=True)
    config.registration_socket_path.write_text("not a socket")
    code = await run_agent(AllocationAgent(config), grace_s=5, handle_signals=False)
    assert code == 1
    assert not config.dra_socket_path.exists()
    assert config.registration_socket_path.read_text() == "not a socket"
