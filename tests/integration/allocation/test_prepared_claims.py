"""The prepared-claims KV (`dra_claims`) as the allocation agent keeps it, against a real
nats-server, real gRPC and the API emulator: a completed prepare puts a PreparedClaim naming
the claim's pods, an unprepare deletes it, a prepare never waits on NATS (the value follows
once NATS is back), and a restarted agent re-asserts what its checkpoint holds."""

from __future__ import annotations

import asyncio
import functools
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from devcluster.apiserver import APIServerEmulator
from devcluster.natsserver import NATSServerProcess
from shared.bus import codec
from shared.bus.connection import Bus
from shared.config import KubeSettings, NATSSettings
from shared.errors import BusUnavailableError
from shared.pb.drasuite.v1 import claim_pb2
from tests.integration.allocation.conftest import DRIVER, NODE, PluginNode

pytestmark = pytest.mark.integration

Pods = list[tuple[str, str, str]]


async def _stored(bus: Bus, uid: str) -> claim_pb2.PreparedClaim | None:
    key = bus.names.claim_key(DRIVER, NODE, uid)
    try:
        data = await bus.kv_get(bus.names.claims_bucket, key)
    except BusUnavailableError:
        return None
    return None if data is None else codec.decode(claim_pb2.PreparedClaim, data, subject=key)


async def _until(bus: Bus, uid: str, check: Callable[[claim_pb2.PreparedClaim | None], bool]):
    deadline = time.monotonic() + 15
    while True:
        found = await _stored(bus, uid)
        if check(found):
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"prepared claim {uid} not as expected: {found}")
        await asyncio.sleep(0.05)


def _pods(found: claim_pb2.PreparedClaim | None) -> Pods:
    return [] if found is None else [(p.namespace, p.name, p.uid) for p in found.pods]


async def test_a_prepared_claim_names_its_pods_until_it_is_unprepared(plugin_node: PluginNode):
    async with plugin_node.registered() as (agent, kubelet):
        await plugin_node.publish_inventory("npu-0", "npu-1")
        await plugin_node.eventually(lambda: agent.inventory.current is not None)
        claim = plugin_node.allocate("train", ["npu-1"], pods={"trainer-0": "pod-uid-0"})
        answer = (await kubelet.prepare([claim])).claims[claim.uid]
        assert answer.error == ""
        found = await _until(plugin_node.bus, claim.uid, lambda f: f is not None)
        assert (found.driver, found.node, found.claim_uid) == (DRIVER, NODE, claim.uid)
        assert (found.namespace, found.name) == ("default", "train")
        assert found.state == claim_pb2.PREPARED_CLAIM_STATE_PREPARED
        assert found.prepared_unix_ms > 0
        assert _pods(found) == [("default", "trainer-0", "pod-uid-0")]
        assert [(list(d.request_names), d.pool, d.device) for d in found.devices] == [
            (["npu"], NODE, "npu-1")
        ]
        assert list(found.devices[0].cdi_device_ids) == list(answer.devices[0].cdi_device_ids)

        assert (await kubelet.unprepare([claim])).claims[claim.uid].error == ""
        await _until(plugin_node.bus, claim.uid, lambda f: f is None)


async def test_a_repeat_prepare_for_another_pod_adds_that_pod(plugin_node: PluginNode):
    async with plugin_node.registered() as (agent, kubelet):
        await plugin_node.publish_inventory("npu-0")
        await plugin_node.eventually(lambda: agent.inventory.current is not None)
        claim = plugin_node.allocate("shared", ["npu-0"], pods={"a": "uid-a"})
        assert (await kubelet.prepare([claim])).claims[claim.uid].error == ""
        await _until(plugin_node.bus, claim.uid, lambda f: _pods(f) == [("default", "a", "uid-a")])
        stored = plugin_node.api.get_object("resourceclaims", "shared", "default")
        assert stored is not None
        stored["status"]["reservedFor"].append({"resource": "pods", "name": "b", "uid": "uid-b"})
        plugin_node.api.update_object(stored, status=True)
        assert (await kubelet.prepare([claim])).claims[claim.uid].error == ""
        await _until(
            plugin_node.bus,
            claim.uid,
            lambda f: _pods(f) == [("default", "a", "uid-a"), ("default", "b", "uid-b")],
        )


@pytest.fixture
async def private_node(
    nats_server_factory: Callable[[], NATSServerProcess],
    kube_settings: KubeSettings,
    kube: APIServerEmulator,
) -> AsyncIterator[tuple[PluginNode, NATSServerProcess]]:
    """A node on its own nats-server, which the test may stop and start again."""
    server = nats_server_factory()
    settings = NATSSettings(url=server.url, namespace="claims", connect_timeout_s=0.5)
    bus = Bus(settings, name="test")
    runner = asyncio.create_task(bus.run())
    await asyncio.wait_for(bus.connected.wait(), 10)
    base = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))
    try:
        yield PluginNode(base, nats=settings, kube=kube_settings, api=kube, bus=bus), server
    finally:
        await bus.close()
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
        shutil.rmtree(base, ignore_errors=True)


async def test_prepare_does_not_wait_for_nats_and_the_claim_follows_once_it_is_back(
    private_node: tuple[PluginNode, NATSServerProcess],
):
    node, server = private_node
    async with node.registered() as (agent, kubelet):
        await node.publish_inventory("npu-0", "npu-1")
        await node.eventually(lambda: agent.inventory.current is not None)
        server.stop()
        claim = node.allocate("offline", ["npu-0"], pods={"p": "uid-p"})
        started = time.monotonic()
        answer = (await kubelet.prepare([claim])).claims[claim.uid]
        assert answer.error == ""
        assert time.monotonic() - started < 2.0
        server.start()
        found = await _until(node.bus, claim.uid, lambda f: f is not None)
        assert _pods(found) == [("default", "p", "uid-p")]


async def test_a_restarted_agent_reasserts_its_checkpointed_claims(plugin_node: PluginNode):
    claim = plugin_node.allocate("kept", ["npu-0"], pods={"k": "uid-k"})
    gone = plugin_node.allocate("gone", ["npu-1"], pods={"g": "uid-g"})
    async with plugin_node.registered() as (agent, kubelet):
        await plugin_node.publish_inventory("npu-0", "npu-1")
        await plugin_node.eventually(lambda: agent.inventory.current is not None)
        answers = (await kubelet.prepare([claim, gone])).claims
        assert answers[claim.uid].error == answers[gone.uid].error == ""
        await _until(plugin_node.bus, claim.uid, lambda f: f is not None)
        await _until(plugin_node.bus, gone.uid, lambda f: f is not None)
    bus = plugin_node.bus
    await bus.kv_delete(bus.names.claims_bucket, bus.names.claim_key(DRIVER, NODE, claim.uid))
    # A key the checkpoint does not know (its claim was unprepared while the agent was away).
    await plugin_node.stored().delete(gone.uid)
    async with plugin_node.registered():
        found = await _until(bus, claim.uid, lambda f: f is not None)
        assert _pods(found) == [("default", "k", "uid-k")]
        await _until(bus, gone.uid, lambda f: f is None)


async def test_back_to_back_prepares_each_get_their_record_and_device_status(
    plugin_node: PluginNode,
):
    """The background writes are deferred while calls are in flight and pipelined, never
    dropped: every claim of a burst gets its KV record and its status.devices entry, and
    loses both after one unprepare call for them all."""
    node = plugin_node
    async with node.registered() as (agent, kubelet):
        await node.publish_inventory("npu-0", "npu-1")
        await node.eventually(lambda: agent.inventory.current is not None)
        claims = [
            node.allocate(f"burst-{i}", [f"npu-{i % 2}"], pods={f"pod-{i}": f"pod-uid-{i}"})
            for i in range(30)
        ]
        for claim in claims:
            assert (await kubelet.prepare([claim])).claims[claim.uid].error == ""

        def status_devices(claim_name: str) -> list[str]:
            stored = node.api.get_object("resourceclaims", claim_name, "default")
            assert stored is not None
            devices = (stored.get("status") or {}).get("devices") or []
            return [d["device"] for d in devices if d["driver"] == DRIVER]

        for i, claim in enumerate(claims):
            found = await _until(node.bus, claim.uid, lambda f: f is not None)
            assert _pods(found) == [("default", f"pod-{i}", f"pod-uid-{i}")]
            await node.eventually(
                functools.partial(_lists, status_devices, claim.name, [f"npu-{i % 2}"])
            )

        answer = await kubelet.unprepare(claims)
        assert {uid: a.error for uid, a in answer.claims.items()} == {c.uid: "" for c in claims}
        for claim in claims:
            await _until(node.bus, claim.uid, lambda f: f is None)
            await node.eventually(functools.partial(_lists, status_devices, claim.name, []))


def _lists(read: Callable[[str], list[str]], name: str, expected: list[str]) -> bool:
    return read(name) == expected
