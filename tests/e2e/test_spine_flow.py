"""The spine end to end: every agent a real process, real nats-server, real gRPC, the emulator.

sim profile -> inventory in KV -> valid ResourceSlice -> a claim allocated two devices ->
kubelet emulator prepares it -> CDI spec names exactly those devices -> a fault on one
device -> taint in the API, alert on the stream, UNHEALTHY on NodeWatchResources ->
recovery removes the taint -> unprepare removes the CDI spec.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from devcluster import flow
from devcluster.kubelet import KubeletEmulator
from devcluster.stack import LocalStack, StackConfig
from shared.bus.session import open_bus
from shared.pb.drasuite.v1 import alert_pb2
from shared.pb.kubelet.drahealth.v1alpha1 import api_pb2 as health_api

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

DRIVER = "sim.dra-suite.io"
NODE = "e2e-node"


@pytest.fixture
async def stack(short_tmp: Path) -> AsyncIterator[LocalStack]:
    config = StackConfig(workdir=short_tmp / "stack", node_name=NODE, driver_name=DRIVER)
    async with LocalStack(config) as running:
        yield running
    # A clean SIGTERM shutdown of every agent is part of the contract.


async def test_claim_flows_from_sim_profile_to_cdi_and_health_and_back(stack: LocalStack):
    cfg = stack.config
    async with open_bus(stack.nats_settings) as bus, stack.kube() as kube:
        inventory = await flow.wait_inventory(bus, driver=DRIVER, node=NODE)
        assert len(inventory.devices) == 12
        npu = next(d for d in inventory.devices if d.name == "npu-5")
        assert npu.attributes["numaNode"].int == 1
        assert npu.attributes["chipName"].string == "910B4"

        slices = await flow.wait_slices(kube, driver=DRIVER, node=NODE, devices=12)
        owner = slices[0]["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"]) == ("Node", NODE)
        claim = await flow.create_claim(
            kube,
            namespace="default",
            name="two-npus",
            device_class="npu.sim.dra-suite.io",
            count=2,
            cel=f'device.attributes["{DRIVER}"].numaNode == 1',
        )
        await flow.create_device_class(
            kube,
            name="npu.sim.dra-suite.io",
            cel=f'device.attributes["{DRIVER}"].type == "npu"',
        )
        claim = await flow.schedule_claim(kube, claim, node=NODE)
        chosen = flow.allocated_devices(claim)
        assert chosen == ["npu-4", "npu-5"]
        ref = flow.kubelet_claim(claim)

        kubelet = KubeletEmulator(cfg.registry_dir)
        try:
            info = await kubelet.register(driver=DRIVER)
            assert list(info.supported_versions)[:2] == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
            answer = (await kubelet.prepare([ref])).claims[ref.uid]
            assert answer.error == ""
            assert sorted(d.device_name for d in answer.devices) == chosen
            assert {d.pool_name for d in answer.devices} == {NODE}
            cdi_ids = sorted(i for d in answer.devices for i in d.cdi_device_ids)
            again = (await kubelet.prepare([ref])).claims[ref.uid]
            assert sorted(i for d in again.devices for i in d.cdi_device_ids) == cdi_ids

            spec = flow.read_cdi_spec(cfg.cdi_root, claim_uid=ref.uid)
            assert spec is not None
            assert sorted(d["name"] for d in spec["devices"]) == [f"{ref.uid}-{d}" for d in chosen]
            assert cdi_ids == sorted(f"{spec['kind']}={d['name']}" for d in spec["devices"])

            await _fault_reaches_api_alerts_and_kubelet(bus, kube, kubelet, device=chosen[0])

            done = (await kubelet.unprepare([ref])).claims[ref.uid]
            assert done.error == ""
            assert flow.read_cdi_spec(cfg.cdi_root, claim_uid=ref.uid) is None
        finally:
            await kubelet.close()
    codes = await stack.stop()
    assert codes == {"health": 0, "allocation": 0, "discovery": 0}


async def _fault_reaches_api_alerts_and_kubelet(bus, kube, kubelet, *, device: str) -> None:
    recorder = flow.HealthStreamRecorder(kubelet)
    watcher = asyncio.create_task(recorder.run())
    feed = flow.alert_feed(bus)
    try:
        await recorder.wait_for(device, health_api.HEALTHY)
        await flow.inject_fault(bus, driver=DRIVER, node=NODE, device=device)
        rule = await flow.wait_taint_rule(kube, device=device)
        assert rule["spec"]["deviceSelector"] == {"driver": DRIVER, "pool": NODE, "device": device}
        assert rule["spec"]["taint"]["effect"] == "NoSchedule"
        raised = await flow.next_alert(feed, device=device, status=alert_pb2.ALERT_STATUS_RAISED)
        assert raised.node == NODE
        assert raised.taint
        await recorder.wait_for(device, health_api.UNHEALTHY)
        event = await flow.wait_node_event(kube, node=NODE, namespace="default")
        assert event["type"] == "Warning"

        await flow.inject_fault(bus, driver=DRIVER, node=NODE, device=device, clear=True)
        await flow.wait_no_taint_rule(kube, device=device)
        resolved = await flow.next_alert(
            feed, device=device, status=alert_pb2.ALERT_STATUS_RESOLVED
        )
        assert resolved.id != raised.id
        await recorder.wait_for(device, health_api.HEALTHY)
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        await feed.aclose()


async def test_demo_walks_the_flow_and_exits_zero(short_tmp: Path):
    from io import StringIO

    from devcluster.demo import run_demo

    out = StringIO()
    code = await run_demo(StackConfig(workdir=short_tmp / "demo", node_name="demo-node"), out=out)
    assert code == 0, out.getvalue()
    assert "CDI spec removed" in out.getvalue()
