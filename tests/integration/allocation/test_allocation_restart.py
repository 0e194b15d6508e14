"""Agent restarts: the checkpoint keeps prepared claims, the saved inventory outlives NATS."""

from __future__ import annotations

import pytest

from shared.config import NATSSettings

pytestmark = pytest.mark.integration


async def _inventory_seen(plugin_node, agent, *names: str) -> None:
    await plugin_node.publish_inventory(*names)
    await plugin_node.eventually(
        lambda: (
            agent.inventory.current is not None
            and [d.name for d in agent.inventory.current.devices] == list(names)
        )
    )


async def test_restart_keeps_the_prepared_claim_and_answers_the_same(plugin_node):
    async with plugin_node.registered() as (agent, kubelet):
        await _inventory_seen(plugin_node, agent, "npu-0", "npu-1")
        claim = plugin_node.allocate("train", ["npu-0", "npu-1"])
        before = await kubelet.prepare([claim])
        spec = plugin_node.spec(claim.uid)
    # The claim disappears while the plugin is down: the stored answer must not need it.
    plugin_node.api.delete_object("resourceclaims", claim.name, "default")
    async with plugin_node.registered() as (_, kubelet):
        assert await kubelet.prepare([claim]) == before
        assert plugin_node.spec(claim.uid) == spec
        assert (await kubelet.unprepare([claim])).claims[claim.uid].error == ""
        assert plugin_node.spec(claim.uid) is None


async def test_restart_rewrites_a_lost_cdi_spec(plugin_node):
    async with plugin_node.registered() as (agent, kubelet):
        await _inventory_seen(plugin_node, agent, "npu-0")
        claim = plugin_node.allocate("train", ["npu-0"])
        await kubelet.prepare([claim])
        spec = plugin_node.spec(claim.uid)
    (plugin_node.config.cdi_root / f"k8s.sim.dra-suite.io-claim_{claim.uid}.json").unlink()
    async with plugin_node.agent():
        assert plugin_node.spec(claim.uid) == spec


async def test_restart_with_nats_down_prepares_from_the_saved_inventory(plugin_node):
    async with plugin_node.registered() as (agent, _):
        await _inventory_seen(plugin_node, agent, "npu-0", "npu-1")
    unreachable = NATSSettings(url="nats://127.0.0.1:1", connect_timeout_s=0.2)
    async with plugin_node.registered(nats=unreachable) as (agent, kubelet):
        assert not agent.bus.connected.is_set()
        claim = plugin_node.allocate("train", ["npu-1"])
        answer = (await kubelet.prepare([claim])).claims[claim.uid]
        assert answer.error == ""
        assert [d.device_name for d in answer.devices] == ["npu-1"]
