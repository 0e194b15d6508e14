"""`SliceReconciler.rejections`: what readiness reads about slices the API refused, their
retries, and the devices the pre-publish check leaves out (`SliceReconciler.unpublished`).

The reconciler runs alone (no NATS) over the sim backend against the API emulator.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from devcluster.apiserver import APIServerEmulator
from services.discovery import apirules, inventory, layout
from services.discovery.reconciler import DEVICES_DROPPED, SliceReconciler
from services.discovery.scanner import DeviceScanner
from shared import metrics
from shared.backoff import Backoff
from shared.config import KubeSettings
from shared.kube.client import KubeClient
from shared.sim.profile import SimDevice
from shared.vendors.sim import discovery as sim
from tests.integration.discovery.agent_runner import eventually

pytestmark = pytest.mark.integration

NODE = "n1"
DRIVER = "sim.dra-suite.io"


@pytest.fixture
def backend() -> sim.SimBackend:
    return sim.SimBackend.from_profile("gpu")


Starter = Callable[[], contextlib.AbstractAsyncContextManager[SliceReconciler]]


@pytest.fixture
def start(kube: APIServerEmulator, kube_settings: KubeSettings, backend: sim.SimBackend) -> Starter:
    """Runs a reconciler (with scanner and backend) for the duration of an `async with`."""
    kube.create_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})

    @contextlib.asynccontextmanager
    async def running() -> AsyncIterator[SliceReconciler]:
        identity = inventory.Identity(driver=DRIVER, node=NODE, pool=NODE, backend="sim")
        scanner = DeviceScanner(backend, identity=identity, interval_s=30.0)
        client = await KubeClient.connect(kube_settings)
        retry = Backoff(initial_s=0.2, max_s=0.4)
        reconciler = SliceReconciler(client, scanner, driver=DRIVER, node=NODE, retry_backoff=retry)
        coros = (backend.watch(), scanner.run(), reconciler.run())
        tasks = [asyncio.create_task(coro) for coro in coros]
        try:
            yield reconciler
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await client.close()

    return running


@pytest.fixture
async def reconciler(start: Starter) -> AsyncIterator[SliceReconciler]:
    async with start() as running:
        yield running


def _published_devices(kube: APIServerEmulator) -> set[str]:
    slices = kube.objects("resourceslices")
    return {d["name"] for s in slices for d in s["spec"].get("devices") or []}


async def test_a_refused_slice_is_listed_with_the_api_message_until_the_devices_change(
    kube: APIServerEmulator, backend: sim.SimBackend, reconciler: SliceReconciler
):
    rule = kube.faults.add(verb="create", resource="resourceslices", status=422)
    rejections = await eventually(lambda: dict(reconciler.rejections))
    content_id, message = next(iter(rejections.items()))
    assert len(content_id) == 16
    assert "injected fault" in message
    with pytest.raises(TypeError):
        reconciler.rejections[content_id] = "x"  # type: ignore[index]  # read-only view
    kube.faults.remove(rule.id)
    backend.add_device(SimDevice(name="gpu-9", kind="gpu"))
    await eventually(lambda: not reconciler.rejections and "gpu-9" in _published_devices(kube))


async def test_a_transient_rejection_is_retried_and_the_slices_come_back(
    kube: APIServerEmulator, reconciler: SliceReconciler
):
    """A 422 that clears (an admission webhook or a quota changed its mind) is not final."""
    kube.faults.add(verb="create", resource="resourceslices", status=422, times=1)
    await eventually(lambda: dict(reconciler.rejections))
    await eventually(lambda: not reconciler.rejections and _published_devices(kube))
    assert _published_devices(kube) == {"gpu-0", "gpu-1", "gpu-2", "gpu-3"}
    await asyncio.wait_for(reconciler.published.wait(), 5)


async def test_a_lasting_rejection_is_retried_with_backoff_until_the_api_accepts(
    kube: APIServerEmulator, reconciler: SliceReconciler
):
    metrics.configure(service="test")
    rule = kube.faults.add(verb="create", resource="resourceslices", status=422)

    def creates() -> int:
        return kube.request_log.count(verb="create", resource="resourceslices", status=422)

    await eventually(lambda: creates() >= 4)  # sent again, more than once
    assert reconciler.rejections
    text = metrics.render().decode()
    assert 'dra_slice_rejections_total{status="422"}' in text
    kube.faults.remove(rule.id)
    await eventually(lambda: not reconciler.rejections and _published_devices(kube))
    settled = creates()
    await asyncio.sleep(1.0)
    assert creates() == settled  # accepted: no more retries


@pytest.fixture
def long_chip_name(backend: sim.SimBackend) -> str:
    chip = "X" * 80
    backend.add_device(SimDevice(name="gpu-long", kind="gpu", attributes={"chipName": chip}))
    return chip


def _dropped_events(kube: APIServerEmulator) -> list[dict[str, Any]]:
    events = kube.objects("events", namespace="default")
    return [e for e in events if e["reason"] == DEVICES_DROPPED]


async def test_a_device_the_check_leaves_out_is_an_event_a_metric_and_listed(
    kube: APIServerEmulator, long_chip_name: str, start: Starter
):
    metrics.configure(service="test")
    async with start() as reconciler:
        await asyncio.wait_for(reconciler.published.wait(), 5)
        dropped = reconciler.unpublished.current["gpu-long"]
        summary = reconciler.unpublished.summary() or ""
        assert not reconciler.rejections  # the rest of the pool was accepted
        (event,) = await eventually(lambda: _dropped_events(kube))
    assert _published_devices(kube) == {"gpu-0", "gpu-1", "gpu-2", "gpu-3"}
    assert dropped.reason == layout.INVALID
    assert "chipName" in dropped.detail
    assert "64 bytes" in dropped.detail
    assert "gpu-long" in summary
    node = kube.get_object("nodes", NODE)
    assert node is not None
    assert event["type"] == "Warning"
    assert event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Node",
        "name": NODE,
        "uid": node["metadata"]["uid"],
    }
    assert "gpu-long (invalid: attribute 'chipName'" in event["message"]
    text = metrics.render().decode()
    assert 'dra_slice_devices_dropped_total{reason="invalid"}' in text


async def test_a_dropped_device_is_reported_once_not_on_every_plan(
    kube: APIServerEmulator,
    backend: sim.SimBackend,
    long_chip_name: str,
    reconciler: SliceReconciler,
):
    await eventually(lambda: _dropped_events(kube))
    backend.add_device(SimDevice(name="gpu-9", kind="gpu"))  # re-plans the pool
    await eventually(lambda: "gpu-9" in _published_devices(kube))
    await asyncio.sleep(0.2)
    assert len(_dropped_events(kube)) == 1
    backend.remove_device("gpu-long")
    await eventually(lambda: not reconciler.unpublished.current)


@pytest.mark.parametrize("kube", ["1.34", "1.35", "1.36"], indirect=True)
async def test_the_rules_follow_the_server_version(
    kube: APIServerEmulator, reconciler: SliceReconciler
):
    await asyncio.wait_for(reconciler.published.wait(), 5)
    assert reconciler.rules is not None
    assert f"1.{reconciler.rules.minor}" == kube.config.kubernetes_version


@pytest.mark.parametrize("kube", ["1.34"], indirect=True)
async def test_the_version_is_retried_while_the_server_fails_to_answer(
    kube: APIServerEmulator, start: Starter
):
    kube.faults.add(verb="get", resource="", status=503, times=3)
    async with start() as reconciler:
        await asyncio.wait_for(reconciler.published.wait(), 10)
        assert reconciler.rules is not None
        assert reconciler.rules.minor == 34
    assert kube.request_log.count(verb="get", resource="", status=503) == 3


@pytest.mark.parametrize("kube", ["1.35"], indirect=True)
async def test_a_server_refusing_its_version_gets_the_newest_rules(
    kube: APIServerEmulator, start: Starter
):
    kube.faults.add(verb="get", resource="", status=403)
    async with start() as reconciler:
        await asyncio.wait_for(reconciler.published.wait(), 5)
        assert reconciler.rules is not None
        assert reconciler.rules.minor == apirules.NEWEST
        assert kube.objects("resourceslices")
