"""Rolling update: two plugin instances on one node, each with its own sockets, one state.

Both instances serve at once (docs/contracts.md §2.3): per-instance socket names, neither removes
the
other's sockets, and prepare/unprepare are serialised across them by the flock on
`serialize.lock`, under which each re-reads the shared checkpoint. Either may get any call.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from devcluster.kubelet import KubeletClaim
from services.allocation.cdi import spec_files
from shared.pb.kubelet.dra.v1 import api_pb2 as dra
from shared.pb.kubelet.dra.v1 import api_pb2_grpc as dra_grpc

pytestmark = pytest.mark.integration

DRIVER = "sim.dra-suite.io"


class Instance:
    """The kubelet's connection to one instance's DRA socket."""

    def __init__(self, socket_path) -> None:
        self.channel = grpc.aio.insecure_channel(f"unix:{socket_path}")
        self.stub = dra_grpc.DRAPluginStub(self.channel)

    async def prepare(self, claim: KubeletClaim) -> dra.NodePrepareResourceResponse:
        request = dra.NodePrepareResourcesRequest(claims=[_claim(claim)])
        return (await self.stub.NodePrepareResources(request, timeout=45)).claims[claim.uid]

    async def unprepare(self, claim: KubeletClaim) -> str:
        request = dra.NodeUnprepareResourcesRequest(claims=[_claim(claim)])
        return (await self.stub.NodeUnprepareResources(request, timeout=45)).claims[claim.uid].error


def _claim(claim: KubeletClaim) -> dra.Claim:
    return dra.Claim(namespace=claim.namespace, name=claim.name, uid=claim.uid)


async def _inventory_seen(plugin_node, *agents) -> None:
    await plugin_node.publish_inventory(*(f"npu-{i}" for i in range(8)))
    await plugin_node.eventually(
        lambda: all(agent.inventory.current is not None for agent in agents)
    )


async def test_two_instances_serve_with_their_own_sockets(plugin_node):
    registry, data = plugin_node.config.plugin_registry_dir, plugin_node.config.data_dir
    async with plugin_node.agent(rolling_update_uid="old-pod"):
        async with plugin_node.agent(rolling_update_uid="new-pod"):
            assert sorted(p.name for p in registry.iterdir()) == [
                f"{DRIVER}-new-pod-reg.sock",
                f"{DRIVER}-old-pod-reg.sock",
            ]
            assert {"dra-new-pod.sock", "dra-old-pod.sock"} <= {p.name for p in data.iterdir()}
        # The new instance stopped: it took only its own sockets with it.
        assert [p.name for p in registry.iterdir()] == [f"{DRIVER}-old-pod-reg.sock"]
        assert (data / "dra-old-pod.sock").is_socket()


async def test_prepare_in_one_instance_and_unprepare_in_the_other(plugin_node):
    async with (
        plugin_node.agent(rolling_update_uid="old-pod") as old,
        plugin_node.agent(rolling_update_uid="new-pod") as new,
    ):
        await _inventory_seen(plugin_node, old, new)
        via_old = Instance(old.config.dra_socket_path)
        via_new = Instance(new.config.dra_socket_path)
        claim = plugin_node.allocate("train", ["npu-3"])
        first = await via_old.prepare(claim)
        assert first.error == ""
        # The other instance knows the claim is prepared: same answer, no second preparation.
        assert await via_new.prepare(claim) == first
        assert new.cdi.writes[claim.uid] == 0
        assert await via_new.unprepare(claim) == ""
        assert plugin_node.spec(claim.uid) is None
        assert plugin_node.checkpoint_files() == []
        # ...and the first instance knows it was unprepared: a new prepare really prepares.
        assert await via_old.prepare(claim) == first
        assert old.cdi.writes[claim.uid] == 2
        assert plugin_node.spec(claim.uid) is not None
        await asyncio.gather(via_old.channel.close(), via_new.channel.close())


async def test_concurrent_calls_to_both_instances_prepare_each_claim_once(plugin_node):
    async with (
        plugin_node.agent(rolling_update_uid="old-pod") as old,
        plugin_node.agent(rolling_update_uid="new-pod") as new,
    ):
        await _inventory_seen(plugin_node, old, new)
        instances = [Instance(old.config.dra_socket_path), Instance(new.config.dra_socket_path)]
        claims = [plugin_node.allocate(f"c{i}", [f"npu-{i % 8}"]) for i in range(12)]
        answers = await asyncio.gather(
            *(instance.prepare(claim) for claim in claims for instance in instances)
        )
        assert all(answer.error == "" for answer in answers)
        for claim in claims:
            assert old.cdi.writes[claim.uid] + new.cdi.writes[claim.uid] == 1
            assert plugin_node.spec(claim.uid) is not None
        errors = await asyncio.gather(
            *(instances[i % 2].unprepare(claim) for i, claim in enumerate(claims))
        )
        assert errors == [""] * len(claims)
        assert plugin_node.cdi_files() == []
        assert plugin_node.checkpoint_files() == []
        await asyncio.gather(*(instance.channel.close() for instance in instances))


async def test_a_recreated_claim_in_one_instance_waits_for_the_unprepare_in_the_other(
    plugin_node,
):
    async with (
        plugin_node.agent(rolling_update_uid="old-pod") as old,
        plugin_node.agent(rolling_update_uid="new-pod") as new,
    ):
        await _inventory_seen(plugin_node, old, new)
        via_old = Instance(old.config.dra_socket_path)
        via_new = Instance(new.config.dra_socket_path)
        before = plugin_node.allocate("train", ["npu-0"])
        assert (await via_old.prepare(before)).error == ""
        plugin_node.api.delete_object("resourceclaims", "train", "default")
        after = plugin_node.allocate("train", ["npu-1"])
        waiting = asyncio.create_task(via_new.prepare(after))
        await asyncio.sleep(0.3)
        assert not waiting.done()
        assert await via_old.unprepare(before) == ""
        answer = await asyncio.wait_for(waiting, 10)
        assert answer.error == ""
        assert [list(d.cdi_device_ids) for d in answer.devices] == [
            [spec_files.device_id(DRIVER, spec_files.device_name(after.uid, "npu-1"))]
        ]
        await asyncio.gather(via_old.channel.close(), via_new.channel.close())
