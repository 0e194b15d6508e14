"""The spine's end-to-end flow as steps over a running stack, each checking what it expects.

Used by `devcluster demo` (which narrates each step) and by the end-to-end test (which asserts
on what the steps return). A step that does not see what it expects within its deadline
raises `FlowError` naming what was missing. The scheduler is not emulated: `allocate_claim`
writes `status.allocation` the way kube-scheduler would, choosing devices from the slices.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import nats.errors
import nats.js.errors
from nats.js import api

from devcluster import scheduler
from devcluster.kubelet import KubeletClaim, KubeletEmulator
from shared.bus import codec
from shared.bus.connection import Bus
from shared.errors import BusUnavailableError, KubeNotFoundError
from shared.kube import resources
from shared.kube.client import KubeClient
from shared.pb.drasuite.v1 import alert_pb2, health_pb2, inventory_pb2

__all__ = [
    "FlowError",
    "HealthStreamRecorder",
    "alert_feed",
    "allocate_as_scheduler",
    "allocate_claim",
    "allocated_devices",
    "create_claim",
    "create_device_class",
    "eventually",
    "find_taint_rules",
    "inject_fault",
    "kubelet_claim",
    "next_alert",
    "read_cdi_spec",
    "schedule_claim",
    "wait_inventory",
    "wait_no_taint_rule",
    "wait_node_event",
    "wait_slices",
    "wait_taint_rule",
]

T = TypeVar("T")
Obj = dict[str, Any]


class FlowError(Exception):
    """An expectation of the flow that was not met within its deadline."""


async def eventually(
    probe: Callable[[], Awaitable[T | None]], *, what: str, timeout_s: float = 15.0
) -> T:
    """Poll `probe` until it returns something other than None (or False)."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = await probe()
        if result is not None and result is not False:
            return result
        if time.monotonic() >= deadline:
            raise FlowError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.05)


async def wait_inventory(bus: Bus, *, driver: str, node: str) -> inventory_pb2.Inventory:
    key = bus.names.inventory_key(driver, node)

    async def probe() -> inventory_pb2.Inventory | None:
        if not bus.connected.is_set():
            return None
        data = await bus.kv_get(bus.names.inventory_bucket, key)
        return None if data is None else codec.decode(inventory_pb2.Inventory, data, subject=key)

    return await eventually(probe, what=f"inventory {key} in KV")


async def wait_slices(kube: KubeClient, *, driver: str, node: str, devices: int) -> list[Obj]:
    """The node's slices once they publish `devices` devices in total."""
    selector = f"spec.nodeName={node},spec.driver={driver}"

    async def probe() -> list[Obj] | None:
        items: list[Obj] = (await kube.list(resources.RESOURCE_SLICES, field_selector=selector))[
            "items"
        ]
        published = sum(len(s["spec"].get("devices", [])) for s in items)
        return items if items and published == devices else None

    return await eventually(probe, what=f"ResourceSlices with {devices} devices for {node}")


async def create_device_class(kube: KubeClient, *, name: str, cel: str) -> Obj:
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": cel}}]},
    }
    return await kube.create(resources.DEVICE_CLASSES, body)


async def create_claim(
    kube: KubeClient,
    *,
    namespace: str,
    name: str,
    device_class: str,
    count: int,
    cel: str,
    constraints: list[Obj] | None = None,
    config: list[Obj] | None = None,
) -> Obj:
    """A claim with one request; `config` is its `spec.devices.config` (opaque DeviceConfigs),
    which allocating it copies into the allocation as kube-scheduler does."""
    body: Obj = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "npus",
                        "exactly": {
                            "deviceClassName": device_class,
                            "allocationMode": "ExactCount",
                            "count": count,
                            "selectors": [{"cel": {"expression": cel}}],
                        },
                    }
                ],
                "constraints": constraints or [],
            }
        },
    }
    if config:
        body["spec"]["devices"]["config"] = config
    return await kube.create(resources.RESOURCE_CLAIMS, body, namespace=namespace)


async def allocate_claim(
    kube: KubeClient, claim: Obj, *, driver: str, node: str, devices: list[str]
) -> Obj:
    """Write status.allocation naming `devices` of the node's pool for the claim's first request."""
    request = claim["spec"]["devices"]["requests"][0]["name"]
    results = [
        scheduler.AllocationResult(request=request, driver=driver, pool=node, device=device)
        for device in devices
    ]
    return await _write_allocation(kube, claim, results=results, node=node)


async def schedule_claim(kube: KubeClient, claim: Obj, *, node: str) -> Obj:
    """Do what kube-scheduler does for a claim (see `allocate_as_scheduler`); a claim that
    cannot be allocated is a FlowError."""
    try:
        return await allocate_as_scheduler(kube, claim, node=node)
    except (scheduler.SelectorError, scheduler.UnsatisfiableError) as exc:
        raise FlowError(f"claim {claim['metadata']['name']} cannot be allocated: {exc}") from exc


async def allocate_as_scheduler(kube: KubeClient, claim: Obj, *, node: str) -> Obj:
    """Evaluate the claim's CEL against the node's slices, pick devices first-fit among those
    (and that capacity and those counters) that no other claim's allocation holds, and write
    status.allocation. Raises the scheduler's SelectorError or UnsatisfiableError."""
    classes = {
        c["metadata"]["name"]: c for c in (await kube.list(resources.DEVICE_CLASSES))["items"]
    }
    slices = (await kube.list(resources.RESOURCE_SLICES, field_selector=f"spec.nodeName={node}"))[
        "items"
    ]
    claims = (await kube.list(resources.RESOURCE_CLAIMS))["items"]
    others = [c for c in claims if c["metadata"]["uid"] != claim["metadata"]["uid"]]
    results = scheduler.allocate(
        claim, classes=classes, slices=slices, in_use=scheduler.allocated_results(others)
    )
    return await _write_allocation(kube, claim, results=results, node=node)


async def _write_allocation(
    kube: KubeClient, claim: Obj, *, results: list[scheduler.AllocationResult], node: str
) -> Obj:
    claim = dict(claim)
    devices: Obj = {"results": [r.as_json() for r in results]}
    # kube-scheduler copies the claim's configs into the allocation, marked as the claim's.
    if configs := claim["spec"]["devices"].get("config"):
        devices["config"] = [{**c, "source": "FromClaim"} for c in configs]
    claim["status"] = {
        "allocation": {
            "devices": devices,
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                ]
            },
        }
    }
    namespace = claim["metadata"]["namespace"]
    return await kube.replace(
        resources.RESOURCE_CLAIMS, claim, namespace=namespace, subresource="status"
    )


def allocated_devices(claim: Obj) -> list[str]:
    return [r["device"] for r in claim["status"]["allocation"]["devices"]["results"]]


def read_cdi_spec(cdi_root: Path, *, claim_uid: str) -> Obj | None:
    """The CDI spec written for a claim (its file name carries the claim UID), if any."""
    for path in sorted(cdi_root.glob(f"*{claim_uid}*.json")):
        spec: Obj = json.loads(path.read_text())
        spec["_path"] = str(path)
        return spec
    return None


async def inject_fault(
    bus: Bus,
    *,
    driver: str,
    node: str,
    device: str,
    clear: bool = False,
    wait_s: float = 20.0,
) -> Obj:
    """Send the sim fault `dractl fault inject` sends, once the health agent can take it.

    A health agent that is still starting has not subscribed yet (no responders) or has not
    read the node's inventory; both are retried for `wait_s`. Any other refusal is final."""
    command = health_pb2.FaultCommand(
        device=device,
        clear=clear,
        cause="injected",
        code="demo-42",
        message="fault injected by the demo",
    )
    subject = bus.names.fault_control(driver, node)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            reply = await bus.request(subject, codec.encode(command), timeout_s=5.0)
        except BusUnavailableError as exc:
            if time.monotonic() > deadline:
                raise FlowError(f"no health agent took the fault on {subject}: {exc}") from exc
            await asyncio.sleep(0.1)
            continue
        answer: Obj = json.loads(reply.data)
        if answer.get("ok"):
            return answer
        if not answer.get("retry") or time.monotonic() > deadline:
            raise FlowError(f"fault command refused: {answer}")
        await asyncio.sleep(0.1)


async def find_taint_rules(kube: KubeClient, *, device: str) -> list[Obj]:
    """DeviceTaintRules selecting `device`, in whichever version the server serves."""
    for version in await kube.served_versions(resources.RESOURCE_GROUP):
        rt = resources.device_taint_rules(version)
        try:
            items: list[Obj] = (await kube.list(rt))["items"]
        except KubeNotFoundError:
            continue  # this version of the group does not serve DeviceTaintRules
        # List items carry no apiVersion; say which version served them.
        return [
            {**rule, "apiVersion": rt.api_version}
            for rule in items
            if rule["spec"].get("deviceSelector", {}).get("device") == device
        ]
    return []


async def wait_taint_rule(kube: KubeClient, *, device: str) -> Obj:
    async def probe() -> Obj | None:
        rules = await find_taint_rules(kube, device=device)
        return rules[0] if rules else None

    return await eventually(probe, what=f"a DeviceTaintRule for {device}")


async def wait_no_taint_rule(kube: KubeClient, *, device: str, timeout_s: float = 30.0) -> None:
    """Until no rule selects `device` (recovery waits out the health agent's hold time)."""

    async def probe() -> bool:
        return not await find_taint_rules(kube, device=device)

    await eventually(
        probe, what=f"the DeviceTaintRules for {device} to be deleted", timeout_s=timeout_s
    )


async def wait_node_event(kube: KubeClient, *, node: str, namespace: str) -> Obj:
    """The latest Event about the Node."""

    async def probe() -> Obj | None:
        items: list[Obj] = (await kube.list(resources.EVENTS, namespace=namespace))["items"]
        found = [e for e in items if e.get("involvedObject", {}).get("name") == node]
        return found[-1] if found else None

    return await eventually(probe, what=f"an Event about node {node}")


async def alert_feed(
    bus: Bus, *, stream_wait_s: float = 30.0
) -> AsyncGenerator[alert_pb2.Alert, None]:
    """Every alert on the stream from its start, then new ones. On a stack just started the
    stream may not exist yet (the health agent makes it on the open bus): wait for it."""
    deadline = time.monotonic() + stream_wait_s
    while True:
        try:
            subscription = await bus.js.subscribe(
                bus.names.alerts_wildcard,
                stream=bus.names.alerts_stream,
                ordered_consumer=True,
                config=api.ConsumerConfig(deliver_policy=api.DeliverPolicy.ALL),
            )
            break
        except nats.js.errors.NotFoundError:
            if time.monotonic() >= deadline:
                raise
            await asyncio.sleep(0.1)
    try:
        while True:
            try:
                msg = await subscription.next_msg(timeout=30)
            except nats.errors.TimeoutError:
                continue
            yield codec.decode_json(alert_pb2.Alert, msg.data, subject=msg.subject)
    finally:
        await subscription.unsubscribe()


async def next_alert(
    feed: AsyncIterator[alert_pb2.Alert], *, device: str, status: int, timeout_s: float = 15.0
) -> alert_pb2.Alert:
    async with asyncio.timeout(timeout_s):
        async for alert in feed:
            if alert.device == device and alert.status == status:
                return alert
    raise FlowError(f"alert stream ended before a {status} alert for {device}")


@dataclass
class HealthStreamRecorder:
    """Keeps the latest NodeWatchResources state per device, as the kubelet's cache does."""

    kubelet: KubeletEmulator
    latest: dict[str, int] = field(default_factory=dict)
    messages: int = 0
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self) -> None:
        async for response in self.kubelet.watch_health():
            self.messages += 1
            for device in response.devices:
                self.latest[device.device.device_name] = device.health
            self._changed.set()

    async def wait_for(self, device: str, health: int, *, timeout_s: float = 15.0) -> None:
        async with asyncio.timeout(timeout_s):
            while self.latest.get(device) != health:
                self._changed.clear()
                await self._changed.wait()


def kubelet_claim(claim: Obj) -> KubeletClaim:
    meta = claim["metadata"]
    return KubeletClaim(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])
