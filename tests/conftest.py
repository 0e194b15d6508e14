"""Fixtures shared by every test: a real nats-server, per-test bus namespaces, the API emulator."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from devcluster.apiserver import APIServerEmulator, ClusterConfig
from devcluster.natsserver import NATSServerProcess
from shared.bus.connection import Bus
from shared.config import KubeSettings, NATSSettings
from tests.hang_report import pytest_runtest_call

__all__ = ["pytest_runtest_call"]

_namespaces = itertools.count(1)


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NATSServerProcess]:
    """One real nats-server with JetStream for the session; tests isolate by namespace."""
    server = NATSServerProcess(tmp_path_factory.mktemp("nats-store"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def nats_server_factory(tmp_path: Path) -> Iterator[Callable[[], NATSServerProcess]]:
    """Private servers for tests that stop, kill or restart NATS."""
    started: list[NATSServerProcess] = []

    def make() -> NATSServerProcess:
        server = NATSServerProcess(tmp_path / f"nats-{len(started)}")
        server.start()
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop()


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A temporary directory with a short path: unix socket paths must fit in 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def bus_namespace() -> str:
    return f"t{next(_namespaces)}"


@pytest.fixture
def nats_settings(nats_server: NATSServerProcess, bus_namespace: str) -> NATSSettings:
    return NATSSettings(url=nats_server.url, namespace=bus_namespace)


@pytest.fixture
async def bus(nats_settings: NATSSettings) -> AsyncIterator[Bus]:
    """A connected Bus on the session server, closed (drained) after the test."""
    connection = Bus(nats_settings, name="test")
    runner = asyncio.create_task(connection.run(), name="bus-connector")
    await asyncio.wait_for(connection.connected.wait(), 10)
    yield connection
    await connection.close()
    runner.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await runner


@pytest.fixture
async def kube(request: pytest.FixtureRequest) -> AsyncIterator[APIServerEmulator]:
    """A started API emulator (Kubernetes 1.36, device taint gates on).

    Parametrize indirectly with a version ("1.34", "1.35", "1.36") or a ClusterConfig.
    """
    param = getattr(request, "param", "1.36")
    config = param if isinstance(param, ClusterConfig) else ClusterConfig.for_tests(param)
    async with APIServerEmulator(config) as server:
        yield server


@pytest.fixture
def kube_settings(kube: APIServerEmulator, tmp_path: Path) -> KubeSettings:
    """KubeSettings whose kubeconfig points at the `kube` emulator."""
    path = kube.write_kubeconfig(tmp_path / "kubeconfig.yaml")
    return KubeSettings(kubeconfig=str(path), request_timeout_s=5.0)
