"""Backend scan failures as Node Events (against the API emulator) and metrics.

One Warning per outage, brought up to date at most every `refresh_s` (a fake clock here),
never one per failed poll; a Normal Event when scans succeed again; repeated outages within
the Event window update the same Events, as the kubelet's event recorder aggregates.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from devcluster.apiserver import APIServerEmulator
from services.discovery import events, inventory, scanreport
from services.discovery.scanner import DeviceScanner
from shared import metrics
from shared.config import KubeSettings
from shared.kube.client import KubeClient
from shared.sim.profile import SimDevice
from shared.vendors.sim import discovery as sim
from tests.integration.discovery.agent_runner import eventually

NODE = "n1"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def client(kube_settings: KubeSettings) -> AsyncIterator[KubeClient]:
    connected = await KubeClient.connect(kube_settings)
    yield connected
    await connected.close()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def reporter(
    client: KubeClient, kube: APIServerEmulator, clock: Clock
) -> AsyncIterator[scanreport.ScanReporter]:
    kube.create_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    node_events = events.NodeEvents(client, node=NODE, window_s=600, clock=clock)
    reporter = scanreport.ScanReporter(node_events, backend="fake", refresh_s=300, clock=clock)
    task = asyncio.create_task(reporter.run())
    yield reporter
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def node_events(kube: APIServerEmulator, reason: str) -> list[dict[str, Any]]:
    return [e for e in kube.objects("events", namespace="default") if e["reason"] == reason]


def event_writes(kube: APIServerEmulator) -> int:
    return len(kube.request_log.writes("events"))


async def settled() -> None:
    """Let the reporter's task run what it was woken for."""
    await asyncio.sleep(0.2)


async def test_a_persistent_failure_raises_one_warning_not_one_per_poll(
    reporter: scanreport.ScanReporter, kube: APIServerEmulator, clock: Clock
):
    reporter.scan_failed("npu-smi output not understood: no header row", kept=8)
    (warning,) = await eventually(lambda: node_events(kube, scanreport.FAILED))
    assert warning["type"] == "Warning"
    assert warning["count"] == 1
    assert warning["involvedObject"]["kind"] == "Node"
    assert warning["involvedObject"]["name"] == NODE
    node = kube.get_object("nodes", NODE)
    assert node is not None
    assert warning["involvedObject"]["uid"] == node["metadata"]["uid"]
    assert "no header row" in warning["message"]
    assert "last good inventory (8 devices) stays published" in warning["message"]
    writes = event_writes(kube)
    for _ in range(50):
        clock.now += 1
        reporter.scan_failed("npu-smi output not understood: no header row", kept=8)
    await settled()
    assert event_writes(kube) == writes
    assert node_events(kube, scanreport.FAILED)[0]["count"] == 1


async def test_a_long_outage_updates_its_warning_after_the_refresh_interval(
    reporter: scanreport.ScanReporter, kube: APIServerEmulator, clock: Clock
):
    reporter.scan_failed("NVML: driver not loaded", kept=None)
    await eventually(lambda: node_events(kube, scanreport.FAILED))
    for _ in range(9):
        reporter.scan_failed("NVML: driver not loaded", kept=None)
    clock.now += 301
    reporter.scan_failed("NVML: GPU is lost", kept=None)
    (warning,) = await eventually(
        lambda: [e for e in node_events(kube, scanreport.FAILED) if e["count"] == 11]
    )
    assert "NVML: GPU is lost" in warning["message"]
    assert "11 failed scans" in warning["message"]
    assert "no inventory has been published yet" in warning["message"]
    assert len(node_events(kube, scanreport.FAILED)) == 1


async def test_recovery_raises_a_normal_event(
    reporter: scanreport.ScanReporter, kube: APIServerEmulator, clock: Clock
):
    reporter.scan_succeeded()  # no outage: nothing to say
    reporter.scan_failed("boom", kept=2)
    await eventually(lambda: node_events(kube, scanreport.FAILED))
    reporter.scan_failed("boom", kept=2)
    clock.now += 42
    reporter.scan_succeeded()
    (recovered,) = await eventually(lambda: node_events(kube, scanreport.RECOVERED))
    assert recovered["type"] == "Normal"
    assert "after 2 failed scan(s) over 42s" in recovered["message"]
    assert not reporter.failing


async def test_an_outage_over_before_it_was_reported_still_gets_both_events(
    reporter: scanreport.ScanReporter, kube: APIServerEmulator
):
    reporter.scan_failed("boom", kept=2)
    reporter.scan_succeeded()
    await eventually(lambda: node_events(kube, scanreport.RECOVERED))
    assert len(node_events(kube, scanreport.FAILED)) == 1


async def test_flapping_within_the_window_updates_the_same_two_events(
    reporter: scanreport.ScanReporter, kube: APIServerEmulator, clock: Clock
):
    for _ in range(3):
        reporter.scan_failed("boom", kept=2)
        await settled()
        clock.now += 10
        reporter.scan_succeeded()
        await settled()
    (warning,) = node_events(kube, scanreport.FAILED)
    (recovered,) = node_events(kube, scanreport.RECOVERED)
    assert (warning["count"], recovered["count"]) == (3, 3)
    clock.now += 601  # past the window: new Events
    reporter.scan_failed("boom", kept=2)
    await eventually(lambda: len(node_events(kube, scanreport.FAILED)) == 2)


async def test_an_event_the_api_refuses_is_dropped_and_the_next_one_written(
    reporter: scanreport.ScanReporter, kube: APIServerEmulator
):
    kube.faults.add(verb="create", resource="events", status=500, times=1)
    reporter.scan_failed("boom", kept=2)
    await settled()
    assert node_events(kube, scanreport.FAILED) == []
    reporter.scan_succeeded()
    await eventually(lambda: node_events(kube, scanreport.RECOVERED))


async def test_failed_scans_are_counted_in_the_metrics(client: KubeClient):
    metrics.configure(service="test")
    reporter = scanreport.ScanReporter(events.NodeEvents(client, node=NODE), backend="metrics")
    reporter.scan_failed("boom", kept=None)
    reporter.scan_failed("boom", kept=None)
    text = metrics.render().decode()
    assert 'dra_backend_scans_failed_total{backend="metrics"} 2.0' in text
    assert 'dra_backend_scan_failing{backend="metrics"} 1.0' in text
    reporter.scan_succeeded()
    assert 'dra_backend_scan_failing{backend="metrics"} 0.0' in metrics.render().decode()


class Outcomes:
    """A `ScanObserver` that lists what it heard."""

    def __init__(self) -> None:
        self.heard: list[tuple[str, int | None]] = []

    def scan_failed(self, error: str, *, kept: int | None) -> None:
        self.heard.append((error, kept))

    def scan_succeeded(self) -> None:
        self.heard.append(("ok", None))


async def test_the_scanner_tells_its_observer_every_outcome():
    backend = sim.SimBackend([SimDevice(name="dev-0", kind="npu")])
    identity = inventory.Identity(driver="sim.dra-suite.io", node=NODE, pool=NODE, backend="sim")
    outcomes = Outcomes()
    scanner = DeviceScanner(backend, identity=identity, interval_s=30, observer=outcomes)
    backend.set_available(False)
    await scanner.scan_once()
    backend.set_available(True)
    await scanner.scan_once()
    backend.set_available(False)
    await scanner.scan_once()
    assert outcomes.heard == [
        ("sim backend: made unavailable", None),
        ("ok", None),
        ("sim backend: made unavailable", 1),
    ]
