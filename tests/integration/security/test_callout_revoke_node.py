"""Revoking a node on the callout-secured bus: `dra-nats-auth revoke-node` cuts node-a now.

node-a's three agents and node-b's are connected; the operator revokes node-a; within seconds
node-a's connections are ended by the auth service (kicked through its SYS user) and each
reconnect is refused at the callout, node-b is not touched, and the service logs and counts it
with `security=true`. Unrevoking lets node-a's agents back by themselves. The list lives in a
ConfigMap, so a service started afterwards (a restart, the other replica) refuses node-a too.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, MutableMapping
from pathlib import Path
from typing import Any

import pytest

from devcluster.apiserver import APIServerEmulator
from services.natsauth.agent import AuthService
from shared.bus.connection import Bus
from shared.supervisor import run_agent
from tests.integration.security.callout_stack import (
    AGENTS,
    DRIVER,
    NAMESPACE,
    ROLES,
    CalloutStack,
    callout_stack,
    connected,
    refused_connect,
)
from tests.integration.security.secure_nats import eventually

pytestmark = pytest.mark.integration

A, B = "node-a", "node-b"


async def _operator(stack: CalloutStack, command: str, *args: str) -> int:
    """The operator's command line, as a process of its own."""
    assert stack.config is not None
    argv = [command, *args, "--namespace", NAMESPACE, "--kubeconfig", stack.config.kube.kubeconfig]
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "services.natsauth", *argv,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    output, _ = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 0, output.decode()
    return process.returncode


@contextlib.asynccontextmanager
async def _agents(stack: CalloutStack, node: str) -> AsyncIterator[list[Bus]]:
    async with contextlib.AsyncExitStack() as opened:
        buses: list[Bus] = []
        for account in AGENTS:
            settings = await stack.agent_settings(account, node)
            bus = connected(settings, component=ROLES[account], node=node)
            buses.append(await opened.enter_async_context(bus))
        yield buses


def _events(events: list[MutableMapping[str, Any]], name: str) -> list[MutableMapping[str, Any]]:
    return [e for e in events if e.get("event") == name]


# nats-py leaves the socket of each refused reconnect (Authorization Violation) to the garbage
# collector, and node-a's Buses retry until unrevoked: those sockets are nats-py's, not ours.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_revoke_ends_the_nodes_connections_and_refuses_it_until_unrevoked(
    kube: APIServerEmulator, tmp_path: Path, bus_events: list[MutableMapping[str, Any]]
):
    async with (
        callout_stack(kube, tmp_path / "stack") as stack,
        _agents(stack, A) as node_a,
        _agents(stack, B) as node_b,
    ):
        b_epochs = [bus.epoch for bus in node_b]
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await _operator(stack, "revoke-node", A, "--reason", "compromised") == 0

        await eventually(lambda: not any(bus.connected.is_set() for bus in node_a), timeout_s=5)
        assert loop.time() - started < 5
        # The clients see the kick before the service has logged its sweep: wait for the log.
        kicked = await eventually(lambda: _events(bus_events, "nats_revoked_node_kicked"))
        assert kicked[0]["security"] is True
        assert len(kicked[0]["connections"]) == 3
        revoked = _events(bus_events, "nats_node_revoked")
        assert revoked[0]["node"] == A
        assert revoked[0]["reason"] == "compromised"
        assert revoked[0]["security"] is True
        # Still out: every reconnect meets the callout, which refuses a revoked node.
        await asyncio.sleep(2)
        assert not any(bus.connected.is_set() for bus in node_a)
        fresh = await stack.token("dra-discovery", node=A)
        assert "authorization violation" in await refused_connect(stack, fresh)
        refusals = _events(bus_events, "nats_client_refused")
        assert any(e["reason"] == "node_revoked" for e in refusals)
        # node-b: never kicked, still writes its own keys.
        assert all(bus.connected.is_set() for bus in node_b)
        assert [bus.epoch for bus in node_b] == b_epochs
        discovery_b = node_b[0]
        key = discovery_b.names.inventory_key(DRIVER, B)
        await discovery_b.kv_put(discovery_b.names.inventory_bucket, key, b"inv")

        assert await _operator(stack, "unrevoke-node", A) == 0
        await eventually(lambda: all(bus.connected.is_set() for bus in node_a), timeout_s=20)
        assert _events(bus_events, "nats_node_unrevoked")[0]["security"] is True


async def test_the_list_outlives_the_service(
    kube: APIServerEmulator, tmp_path: Path, bus_events: list[MutableMapping[str, Any]]
):
    """Revoked while no auth service runs: the one that starts next refuses node-a from its
    first answer (a restart, or the second replica: both read the same ConfigMap)."""
    async with callout_stack(kube, tmp_path / "stack", in_process=False) as stack:
        assert await _operator(stack, "revoke-node", A, "--until", "1h") == 0
        assert stack.config is not None
        service = AuthService(stack.config)
        stop = asyncio.Event()
        task = asyncio.create_task(run_agent(service, grace_s=5, stop=stop, handle_signals=False))
        try:
            await asyncio.wait_for(service.subscribed.wait(), 10)
            token_a = await stack.token("dra-health", node=A)
            assert "authorization violation" in await refused_connect(stack, token_a)
            async with connected(await stack.agent_settings("dra-health", B),
                                 component="health", node=B):  # fmt: skip
                pass
        finally:
            stop.set()
            assert await asyncio.wait_for(task, 10) == 0
