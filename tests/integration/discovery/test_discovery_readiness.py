"""The discovery agent's /readyz: not ready until its slices are published, and not ready while
the API server rejects one of them (the rejection's message is the reason)."""

from __future__ import annotations

import asyncio
import socket

import aiohttp
import pytest

from services.devcluster import flow
from services.devcluster.apiserver import APIServerEmulator
from services.discovery.agent import DiscoveryAgent
from services.discovery.config import DiscoveryConfig
from shared.config import KubeSettings, NATSSettings, OpsSettings
from shared.supervisor import run_agent

pytestmark = pytest.mark.integration

NODE = "ready-node"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


async def _readyz(port: int) -> tuple[int, str]:
    try:
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://127.0.0.1:{port}/readyz") as response,
        ):
            return response.status, await response.text()
    except aiohttp.ClientConnectionError:
        return 0, ""


async def test_readiness_fails_with_the_api_servers_reason_while_a_slice_is_rejected(
    kube: APIServerEmulator, kube_settings: KubeSettings, nats_settings: NATSSettings
):
    kube.create_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    kube.faults.add(verb="create", resource="resourceslices", status=422)
    port = _free_port()
    config = DiscoveryConfig(
        nats=nats_settings,
        kube=kube_settings,
        node_name=NODE,
        sim_profile="gpu",
        ops=OpsSettings(ops_host="127.0.0.1", ops_port=port),
    )
    stop = asyncio.Event()
    runner = asyncio.create_task(
        run_agent(DiscoveryAgent(config), grace_s=5, stop=stop, handle_signals=False)
    )
    try:

        async def rejected() -> str | None:
            status, text = await _readyz(port)
            return text if status == 503 and "rejected" in text else None

        reason = await flow.eventually(rejected, what="readiness to report the rejection")
        assert "422 Invalid: injected fault" in reason
        assert kube.objects("resourceslices") == []
    finally:
        stop.set()
        assert await runner == 0
