"""Fixtures for the API server emulator tests: a started emulator, HTTP and kube clients."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client, config

from devcluster.apiserver import APIServerEmulator, ClusterConfig

SliceFactory = Callable[..., dict[str, Any]]


@pytest.fixture
async def apiserver() -> AsyncIterator[APIServerEmulator]:
    """An emulated 1.36 cluster with the DRA taint gates on, on a free port."""
    async with APIServerEmulator(ClusterConfig.for_tests()) as server:
        yield server


@pytest.fixture
async def http(apiserver: APIServerEmulator) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(base_url=apiserver.url) as session:
        yield session


@pytest.fixture
async def kube(apiserver: APIServerEmulator, tmp_path: Path) -> AsyncIterator[client.ApiClient]:
    """A kubernetes-asyncio ApiClient loaded from the emulator's kubeconfig."""
    path = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    configuration = client.Configuration()
    await config.load_kube_config(config_file=str(path), client_configuration=configuration)
    async with client.ApiClient(configuration) as api:
        yield api


def _device(index: int, **extra: Any) -> dict[str, Any]:
    return {
        "name": f"gpu-{index}",
        "attributes": {
            "index": {"int": index},
            "model": {"string": "H100"},
            "driverVersion": {"version": "550.54.15"},
            "resource.kubernetes.io/pcieRoot": {"string": "pci0000:00"},
        },
        "capacity": {"memory": {"value": "80Gi"}},
        **extra,
    }


def make_slice(
    name: str = "node-1-gpu",
    *,
    node: str = "node-1",
    driver: str = "gpu.example.com",
    devices: int = 2,
    device_extra: dict[str, Any] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name, "labels": {"driver": driver.split(".")[0]}},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [_device(i, **(device_extra or {})) for i in range(devices)],
            **spec,
        },
    }


@pytest.fixture
def slice_factory() -> SliceFactory:
    """`slice_factory(name, node=..., driver=..., devices=N, device_extra={...}, **spec)`."""
    return make_slice


@pytest.fixture
def claim_factory() -> Callable[..., dict[str, Any]]:
    def make(name: str = "claim-1", namespace: str = "default", **spec: Any) -> dict[str, Any]:
        request = {"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com"}}
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"devices": {"requests": [request]}, **spec},
        }

    return make
