"""`devcluster demo`: run the whole suite locally and walk the spine's flow, printing each step.

Exits 0 only when every step saw what it expected; on failure it names the step and points
at the agents' logs under the work directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from dataclasses import dataclass
from typing import Any, TextIO

from devcluster import flow
from devcluster.kubelet import KubeletClaim, KubeletEmulator
from devcluster.stack import OPEN_BUS_WARNING, LocalStack, StackConfig
from shared.bus.connection import Bus
from shared.bus.session import open_bus
from shared.kube.client import KubeClient
from shared.pb.drasuite.v1 import alert_pb2
from shared.pb.kubelet.drahealth.v1alpha1 import api_pb2 as health_api

__all__ = ["run_demo"]

NAMESPACE = "default"
CLAIM = "demo-npus"
NPU_CLASS = "npu.sim.dra-suite.io"
Obj = dict[str, Any]


class _Narrator:
    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.step = 0

    def __call__(self, title: str) -> None:
        self.step += 1
        self.out.write(f"\n[{self.step}] {title}\n")
        self.out.flush()

    def detail(self, text: str) -> None:
        self.out.write(f"    {text}\n")
        self.out.flush()


@dataclass
class _Walk:
    """What every step of the walk uses."""

    stack: LocalStack
    say: _Narrator
    bus: Bus
    kube: KubeClient
    kubelet: KubeletEmulator

    @property
    def driver(self) -> str:
        return self.stack.config.driver_name

    @property
    def node(self) -> str:
        return self.stack.config.node_name


async def run_demo(config: StackConfig, *, out: TextIO = sys.stdout) -> int:
    say = _Narrator(out)
    say(f"starting nats-server, the API emulator and three agents under {config.workdir}")
    async with LocalStack(config) as stack:
        assert stack.nats is not None
        say.detail(f"nats-server at {stack.nats.url}; kubeconfig {config.kubeconfig}")
        say.detail(OPEN_BUS_WARNING)
        say.detail("agents: " + ", ".join(f"{n} (pid {p.pid})" for n, p in stack.agents.items()))
        try:
            async with open_bus(stack.nats_settings) as bus, stack.kube() as kube:
                walk = _Walk(stack, say, bus, kube, KubeletEmulator(config.registry_dir))
                try:
                    await _run_steps(walk)
                finally:
                    await walk.kubelet.close()
        except (flow.FlowError, TimeoutError) as exc:
            out.write(f"\nFAILED at step {say.step}: {exc or 'timed out'}\n")
            for agent, why in stack.exited_agents().items():
                out.write(f"    {agent} is not running: {why}\n")
            out.write(f"agent logs: {config.logs_dir}\n")
            return 1
        say("SIGTERM to every agent: each drains NATS, removes its sockets and exits")
        codes = await stack.stop()
        say.detail(", ".join(f"{agent} exited {code}" for agent, code in codes.items()))
        if any(code != 0 for code in codes.values()):
            out.write(f"\nFAILED: an agent did not exit cleanly; logs: {config.logs_dir}\n")
            return 1
    return 0


async def _run_steps(walk: _Walk) -> None:
    await _discovery(walk)
    claim, chosen = await _claim(walk)
    ref = await _prepare(walk, claim, chosen)
    await _fault_and_recovery(walk, chosen[0])
    await _unprepare(walk, ref)


async def _discovery(walk: _Walk) -> list[Obj]:
    cfg = walk.stack.config
    walk.say(f"discovery agent: sim profile '{cfg.sim_profile}' -> inventory in the KV bucket")
    inventory = await flow.wait_inventory(walk.bus, driver=walk.driver, node=walk.node)
    names = ", ".join(d.name for d in inventory.devices)
    walk.say.detail(f"{len(inventory.devices)} devices, generation {inventory.generation}: {names}")
    walk.say("discovery agent: ResourceSlices published and accepted by the API emulator")
    slices = await flow.wait_slices(
        walk.kube, driver=walk.driver, node=walk.node, devices=len(inventory.devices)
    )
    for item in slices:
        pool = item["spec"]["pool"]
        walk.say.detail(
            f"{item['metadata']['name']}: {len(item['spec']['devices'])} devices, "
            f"pool {pool['name']} generation {pool['generation']}"
        )
    return slices


async def _claim(walk: _Walk) -> tuple[Obj, list[str]]:
    walk.say("a user claims 2 NPUs on NUMA node 1 in one HCCS ring; the scheduler's CEL picks them")
    await flow.create_device_class(
        walk.kube,
        name=NPU_CLASS,
        cel=f'device.driver == "{walk.driver}" && device.attributes["{walk.driver}"].type == "npu"',
    )
    claim = await flow.create_claim(
        walk.kube,
        namespace=NAMESPACE,
        name=CLAIM,
        device_class=NPU_CLASS,
        count=2,
        cel=f'device.attributes["{walk.driver}"].numaNode == 1',
        constraints=[{"matchAttribute": f"{walk.driver}/topologyGroup"}],
    )
    claim = await flow.schedule_claim(walk.kube, claim, node=walk.node)
    chosen = flow.allocated_devices(claim)
    walk.say.detail(f"claim {NAMESPACE}/{CLAIM} uid {claim['metadata']['uid']} -> {chosen}")
    return claim, chosen


async def _prepare(walk: _Walk, claim: Obj, chosen: list[str]) -> KubeletClaim:
    walk.say("kubelet emulator: plugin registration")
    info = await walk.kubelet.register(driver=walk.driver)
    walk.say.detail(
        f"{info.name} at {info.endpoint}, versions {list(info.supported_versions)}; "
        f"the kubelet chose {walk.kubelet.dra_version}"
    )
    walk.say("kubelet emulator: NodePrepareResources")
    ref = flow.kubelet_claim(claim)
    answer = (await walk.kubelet.prepare([ref])).claims[ref.uid]
    if answer.error:
        raise flow.FlowError(f"prepare failed: {answer.error}")
    for device in answer.devices:
        walk.say.detail(f"{device.pool_name}/{device.device_name} -> {list(device.cdi_device_ids)}")
    walk.say("the CDI spec on disk names exactly the allocated devices")
    spec = flow.read_cdi_spec(walk.stack.config.cdi_root, claim_uid=ref.uid)
    if spec is None:
        raise flow.FlowError("no CDI spec written for the claim")
    named = sorted(d["name"] for d in spec["devices"])
    walk.say.detail(f"{spec['_path']}: kind {spec['kind']}, cdiVersion {spec['cdiVersion']}")
    walk.say.detail(f"devices {named}")
    if sorted(f"{ref.uid}-{d}" for d in chosen) != named:
        raise flow.FlowError(f"CDI spec names {named}, expected the devices {chosen}")
    return ref


async def _fault_and_recovery(walk: _Walk, device: str) -> None:
    recorder = flow.HealthStreamRecorder(walk.kubelet)
    watcher = asyncio.create_task(recorder.run(), name="health-stream")
    feed = flow.alert_feed(walk.bus)
    try:
        await recorder.wait_for(device, health_api.HEALTHY)
        walk.say(f"health stream open ({device} HEALTHY); a fault is injected on {device}")
        await flow.inject_fault(walk.bus, driver=walk.driver, node=walk.node, device=device)
        rule = await flow.wait_taint_rule(walk.kube, device=device)
        taint = rule["spec"]["taint"]
        walk.say.detail(
            f"DeviceTaintRule {rule['metadata']['name']} ({rule['apiVersion']}): "
            f"{taint['key']}={taint.get('value', '')}:{taint['effect']}"
        )
        raised = await flow.next_alert(feed, device=device, status=alert_pb2.ALERT_STATUS_RAISED)
        walk.say.detail(f"alert RAISED id {raised.id}, cause {raised.cause}, taint {raised.taint}")
        await recorder.wait_for(device, health_api.UNHEALTHY)
        walk.say.detail(f"kubelet health stream: {device} UNHEALTHY")
        event = await flow.wait_node_event(walk.kube, node=walk.node, namespace=NAMESPACE)
        walk.say.detail(f"Node Event {event['reason']}: {event['message']}")

        walk.say("the fault clears: taint removed, device healthy again")
        await flow.inject_fault(
            walk.bus, driver=walk.driver, node=walk.node, device=device, clear=True
        )
        await flow.wait_no_taint_rule(walk.kube, device=device)
        resolved = await flow.next_alert(
            feed, device=device, status=alert_pb2.ALERT_STATUS_RESOLVED
        )
        await recorder.wait_for(device, health_api.HEALTHY)
        walk.say.detail(f"rule deleted; alert RESOLVED id {resolved.id}; stream says HEALTHY")
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        await feed.aclose()


async def _unprepare(walk: _Walk, ref: KubeletClaim) -> None:
    walk.say("kubelet emulator: NodeUnprepareResources")
    answer = (await walk.kubelet.unprepare([ref])).claims[ref.uid]
    if answer.error:
        raise flow.FlowError(f"unprepare failed: {answer.error}")
    if flow.read_cdi_spec(walk.stack.config.cdi_root, claim_uid=ref.uid) is not None:
        raise flow.FlowError("CDI spec still on disk after unprepare")
    walk.say.detail("CDI spec removed")
