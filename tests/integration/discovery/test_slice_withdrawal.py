"""`--publish-slices false`: a device-plugin node keeps its inventory on the bus and no slices.

The node moves from the DRA front to the device-plugin front: the slices the DRA-time agent
published must go (else the scheduler would allocate those devices through DRA while the
kubelet's device manager hands them out too), and a slice that reappears is withdrawn again.
The inventory stays on the bus, because the device-plugin front and the health agent read it.
"""

from __future__ import annotations

import asyncio

import pytest

from devcluster.apiserver import APIServerEmulator
from services.discovery import cli as discovery_cli
from services.discovery.agent import DiscoveryAgent
from services.discovery.config import DiscoveryConfig
from shared.bus.connection import Bus
from shared.config import KubeSettings, NATSSettings
from shared.errors import ConfigError
from shared.vendors.sim import discovery as sim
from tests.integration.discovery.test_discovery_agent import (
    DRIVER,
    NODE,
    create_node,
    eventually,
    inventory_with,
    one_slice,
    our_slices,
    running,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def dra_config(nats_settings: NATSSettings, kube_settings: KubeSettings) -> DiscoveryConfig:
    return DiscoveryConfig(node_name=NODE, nats=nats_settings, kube=kube_settings)


@pytest.fixture
def dp_config(nats_settings: NATSSettings, kube_settings: KubeSettings) -> DiscoveryConfig:
    return DiscoveryConfig(
        node_name=NODE, nats=nats_settings, kube=kube_settings, publish_slices="false"
    )


def _other_drivers_slice(kube: APIServerEmulator) -> dict[str, object]:
    return kube.create_object(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": "other-driver-slice"},
            "spec": {
                "driver": "gpu.example.com",
                "nodeName": NODE,
                "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": "gpu-0"}],
            },
        }
    )


def test_the_flag_and_its_env_twin_choose_the_mode() -> None:
    assert discovery_cli.parse_config(["--node-name", NODE], {}).publish_slices == "true"
    by_flag = discovery_cli.parse_config(["--node-name", NODE, "--publish-slices", "false"], {})
    by_env = discovery_cli.parse_config(["--node-name", NODE], {"PUBLISH_SLICES": "auto"})
    assert by_flag.publish_slices == "false"
    assert by_env.publish_slices == "auto"
    with pytest.raises(ConfigError, match="publish slices 'maybe' is not one of"):
        DiscoveryConfig(node_name=NODE, publish_slices="maybe")


async def test_a_node_switched_to_the_device_plugin_front_withdraws_its_slices(
    dra_config: DiscoveryConfig, dp_config: DiscoveryConfig, kube: APIServerEmulator, bus: Bus
) -> None:
    create_node(kube)
    _other_drivers_slice(kube)
    async with running(DiscoveryAgent(dra_config, backend=sim.SimBackend.from_profile("mixed"))):
        await eventually(lambda: one_slice(kube))  # the node as it ran under the DRA front

    async with running(
        DiscoveryAgent(dp_config, backend=sim.SimBackend.from_profile("mixed"))
    ) as agent:
        await asyncio.wait_for(agent.published.wait(), 10)
        ours = [s for s in our_slices(kube) if s["spec"]["driver"] == DRIVER]
        assert ours == []
        # Another driver's slice on the same node is not ours to touch.
        assert kube.get_object("resourceslices", "other-driver-slice") is not None
        # The inventory is still published for the device-plugin front and the health agent.
        assert len((await inventory_with(bus, generation=1)).devices) == 12

        # A slice of ours that shows up again (an old agent still rolling out) goes too.
        kube.create_object(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": f"{NODE}-{DRIVER}-late"},
                "spec": {
                    "driver": DRIVER,
                    "nodeName": NODE,
                    "pool": {"name": NODE, "generation": 5, "resourceSliceCount": 1},
                    "devices": [{"name": "npu-0"}],
                },
            }
        )
        await eventually(
            lambda: not any(s["spec"]["driver"] == DRIVER for s in our_slices(kube)) or None
        )


async def test_a_withdrawing_agent_on_a_clean_node_writes_nothing(
    dp_config: DiscoveryConfig, kube: APIServerEmulator, bus: Bus
) -> None:
    create_node(kube)
    async with running(
        DiscoveryAgent(dp_config, backend=sim.SimBackend.from_profile("mixed"))
    ) as agent:
        await asyncio.wait_for(agent.published.wait(), 10)
        await inventory_with(bus, generation=1)
        await asyncio.sleep(0.3)
    assert kube.request_log.writes("resourceslices") == []


@pytest.mark.parametrize(
    ("label", "publishes"),
    [(None, True), ("dra", True), ("device-plugin", False)],
    ids=["unlabelled", "dra", "device-plugin"],
)
async def test_auto_follows_the_nodes_kubelet_front_label(
    nats_settings: NATSSettings,
    kube_settings: KubeSettings,
    kube: APIServerEmulator,
    label: str | None,
    publishes: bool,
) -> None:
    labels = {} if label is None else {"dra-suite.io/kubelet-api": label}
    kube.create_object(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": labels}}
    )
    auto = DiscoveryConfig(
        node_name=NODE, nats=nats_settings, kube=kube_settings, publish_slices="auto"
    )
    async with running(DiscoveryAgent(auto, backend=sim.SimBackend.from_profile("mixed"))) as a:
        await asyncio.wait_for(a.published.wait(), 10)
        assert bool(our_slices(kube)) is publishes
