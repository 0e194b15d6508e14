"""`devcluster load`: a small, steady load on a running stack, so that dashboards show data.

Each round does what a pod's life does to a node: a ResourceClaim for one or two devices of
the driver, allocated on the node, prepared through a kubelet emulator (which also keeps the
plugin registered, so the allocation agent is ready), held a moment, unprepared and deleted.
Every few rounds a device gets a sim fault, cleared in the next round (taint, alert, Event).
It runs until stopped, or for a number of rounds.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from devcluster import flow
from devcluster.kubelet import KubeletEmulator, KubeletError
from shared.bus.connection import Bus
from shared.bus.session import open_bus
from shared.config import KubeSettings, NATSSettings
from shared.errors import BusUnavailableError, KubeAlreadyExistsError, KubeError
from shared.kube import resources
from shared.kube.client import KubeClient

__all__ = ["LoadPlan", "LoadTarget", "run_load"]

_NAMESPACE = "default"


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadTarget:
    """Where the stack is: what `devcluster up` records, or the compose services' addresses."""

    kubeconfig: str
    nats_url: str
    nats_namespace: str = ""
    plugin_registry_dir: Path
    driver: str
    node: str

    @classmethod
    def from_endpoints(cls, endpoints: dict[str, Any]) -> LoadTarget:
        return cls(
            kubeconfig=endpoints["kubeconfig"],
            nats_url=endpoints["nats_url"],
            nats_namespace=endpoints.get("nats_namespace", ""),
            plugin_registry_dir=Path(endpoints["plugin_registry_dir"]),
            driver=endpoints["driver"],
            node=endpoints["node"],
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadPlan:
    interval_s: float = 2.0
    """Pause between rounds, and how long each claim stays prepared."""
    rounds: int = 0
    """How many rounds; 0 runs until stopped."""
    fault_every: int = 5
    """A fault on a device every this many rounds (cleared the round after); 0: never."""


@dataclass
class _Round:
    bus: Bus
    kube: KubeClient
    kubelet: KubeletEmulator
    target: LoadTarget
    out: TextIO
    faulty: str = ""
    """The device with an injected fault, cleared next round."""


async def run_load(target: LoadTarget, plan: LoadPlan, *, stop: asyncio.Event, out: TextIO) -> int:
    """Run rounds until `stop` is set or `plan.rounds` are done; 0 when every round worked."""
    settings = NATSSettings(url=target.nats_url, namespace=target.nats_namespace)
    kube = await KubeClient.connect(KubeSettings(kubeconfig=target.kubeconfig))
    kubelet = KubeletEmulator(target.plugin_registry_dir)
    failures = 0
    try:
        async with open_bus(settings, timeout_s=30.0) as bus:
            await kubelet.register(driver=target.driver, timeout_s=60.0)
            await _ensure_device_class(kube, driver=target.driver)
            await _pool_published(kube, driver=target.driver, node=target.node)
            state = _Round(bus, kube, kubelet, target, out)
            number = 0
            while not stop.is_set() and (plan.rounds == 0 or number < plan.rounds):
                number += 1
                if not await _one_round(state, number=number, plan=plan, stop=stop):
                    failures += 1
            if state.faulty:
                await _fault(state, device=state.faulty, clear=True)
    finally:
        await kubelet.close()
        await kube.close()
    return 0 if failures == 0 else 1


async def _pool_published(kube: KubeClient, *, driver: str, node: str) -> None:
    """Until the node's pool is whole in the API: on a stack just started, the discovery agent
    may not have published it yet, and a claim would find no devices."""
    selector = f"spec.nodeName={node},spec.driver={driver}"

    async def whole() -> bool | None:
        items = (await kube.list(resources.RESOURCE_SLICES, field_selector=selector))["items"]
        if not items:
            return None
        newest = max(int(s["spec"]["pool"]["generation"]) for s in items)
        current = [s for s in items if int(s["spec"]["pool"]["generation"]) == newest]
        return len(current) == int(current[0]["spec"]["pool"]["resourceSliceCount"]) or None

    await flow.eventually(whole, what=f"the ResourceSlices of {node}", timeout_s=60.0)


async def _ensure_device_class(kube: KubeClient, *, driver: str) -> None:
    with contextlib.suppress(KubeAlreadyExistsError):
        await flow.create_device_class(kube, name=driver, cel=f'device.driver == "{driver}"')


async def _one_round(state: _Round, *, number: int, plan: LoadPlan, stop: asyncio.Event) -> bool:
    """One claim's life (and maybe a fault); False when a step failed (it is printed)."""
    name = f"load-{number}"
    if state.faulty:
        await _fault(state, device=state.faulty, clear=True)
        state.faulty = ""
    try:
        devices = await _claim_cycle(
            state, name=name, count=1 + number % 2, hold_s=plan.interval_s, stop=stop
        )
    except (flow.FlowError, KubeletError, KubeError, BusUnavailableError) as exc:
        state.out.write(f"round {number}: {name} failed: {exc}\n")
        state.out.flush()
        with contextlib.suppress(KubeError):
            await state.kube.delete(resources.RESOURCE_CLAIMS, name, namespace=_NAMESPACE)
        return False
    if plan.fault_every and number % plan.fault_every == 0 and devices:
        state.faulty = devices[0]
        await _fault(state, device=state.faulty, clear=False)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), plan.interval_s)
    return True


async def _claim_cycle(
    state: _Round, *, name: str, count: int, hold_s: float, stop: asyncio.Event
) -> list[str]:
    """Create, allocate, prepare, hold, unprepare and delete one claim; its devices."""
    claim = await flow.create_claim(
        state.kube,
        namespace=_NAMESPACE,
        name=name,
        device_class=state.target.driver,
        count=count,
        cel="true",
    )
    claim = await flow.schedule_claim(state.kube, claim, node=state.target.node)
    ref = flow.kubelet_claim(claim)
    started = time.monotonic()
    answer = (await state.kubelet.prepare([ref])).claims[ref.uid]
    if answer.error:
        raise flow.FlowError(f"prepare: {answer.error}")
    took_ms = (time.monotonic() - started) * 1000
    devices = [d.device_name for d in answer.devices]
    state.out.write(f"{name}: prepared {devices} in {took_ms:.0f} ms\n")
    state.out.flush()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), hold_s)
    unprepared = (await state.kubelet.unprepare([ref])).claims[ref.uid]
    if unprepared.error:
        raise flow.FlowError(f"unprepare: {unprepared.error}")
    await state.kube.delete(resources.RESOURCE_CLAIMS, name, namespace=_NAMESPACE)
    return devices


async def _fault(state: _Round, *, device: str, clear: bool) -> None:
    try:
        await flow.inject_fault(
            state.bus,
            driver=state.target.driver,
            node=state.target.node,
            device=device,
            clear=clear,
        )
    except (flow.FlowError, BusUnavailableError) as exc:
        state.out.write(f"fault on {device}: {exc}\n")
    else:
        state.out.write(f"fault {'cleared on' if clear else 'injected on'} {device}\n")
    state.out.flush()
