"""`SliceReconciler.rejections`: what readiness reads about slices the API refused.

The reconciler runs alone (no NATS) over the sim backend against the API emulator.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import pytest

from services.devcluster.apiserver import APIServerEmulator
from services.discovery import apirules, inventory
from services.discovery.backends import sim
from services.discovery.reconciler import SliceReconciler
from services.discovery.scanner import DeviceScanner
from shared.config import KubeSettings
from shared.kube.client import KubeClient
from shared.sim.profile import SimDevice
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
        reconciler = SliceReconciler(client, scanner, driver=DRIVER, node=NODE)
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


async def test_a_refused_slice_is_listed_with_the_api_message_until_the_devices_change(
    kube: APIServerEmulator, backend: sim.SimBackend, reconciler: SliceReconciler
):
    kube.faults.add(verb="create", resource="resourceslices", status=422, times=1)
    rejections = await eventually(lambda: dict(reconciler.rejections))
    ((content_id, message),) = rejections.items()
    assert len(content_id) == 16
    assert "injected fault" in message
    await asyncio.wait_for(reconciler.published.wait(), 5)  # an empty stand-in is published
    assert dict(reconciler.rejections) == rejections  # still refused: readiness stays failed
    backend.add_device(SimDevice(name="gpu-9", kind="gpu"))
    await eventually(lambda: not reconciler.rejections and kube.objects("resourceslices"))
    with pytest.raises(TypeError):
        reconciler.rejections[content_id] = "x"  # type: ignore[index]  # read-only view


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
