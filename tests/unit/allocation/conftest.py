"""Fakes and builders for the allocation agent's unit tests: a KubeReader, claims, inventories.

Builders are handed out as fixtures (`make_claim`, `make_inventory`): with pytest's importlib
import mode, test modules cannot import a helper module next to them.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pytest

from shared.errors import KubeNotFoundError
from shared.kube.resources import ResourceType
from shared.pb.drasuite.v1 import inventory_pb2

DRIVER = "sim.dra-suite.io"
NODE = "node-a"


def new_uid() -> str:
    return str(uuid.uuid4())


def claim_object(
    *,
    uid: str,
    name: str = "claim-a",
    namespace: str = "default",
    devices: Sequence[str] = ("npu-0",),
    request: str = "req",
    driver: str = DRIVER,
    pool: str = NODE,
    allocated: bool = True,
    extra_results: Iterable[dict[str, Any]] = (),
    config: Iterable[dict[str, Any]] = (),
) -> dict[str, Any]:
    """A resource.k8s.io/v1 ResourceClaim allocated to `devices` (one result each)."""
    claim: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "spec": {"devices": {"requests": [{"name": request.split("/")[0]}]}},
        "status": {},
    }
    if allocated:
        results = [
            {"request": request, "driver": driver, "pool": pool, "device": device}
            for device in devices
        ]
        claim["status"]["allocation"] = {
            "devices": {"results": [*results, *extra_results], "config": list(config)}
        }
    return claim


def inventory(*names: str, driver: str = DRIVER, node: str = NODE) -> inventory_pb2.Inventory:
    """Ascend-like devices `npu-N`: one device node each (mapped to /dev/null) and an env var."""
    devices = []
    for name in names:
        index = name.rsplit("-", 1)[-1]
        devices.append(
            inventory_pb2.Device(
                name=name,
                kind="npu",
                device_nodes=[
                    inventory_pb2.DeviceNode(path=f"/dev/davinci{index}", host_path="/dev/null")
                ],
                env={"ASCEND_VISIBLE_DEVICES": index},
            )
        )
    return inventory_pb2.Inventory(
        driver=driver, node=node, pool=node, backend="sim", devices=devices, generation=1
    )


class FakeKubeReader:
    """A KubeReader over a dict of claims keyed by (namespace, name); errors can be queued."""

    def __init__(self, *claims: dict[str, Any]) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.errors: list[Exception] = []
        self.gets = 0
        for claim in claims:
            self.put(claim)

    def put(self, claim: dict[str, Any]) -> None:
        meta = claim["metadata"]
        self.objects[(meta["namespace"], meta["name"])] = claim

    async def get(
        self, rt: ResourceType, name: str, *, namespace: str | None = None
    ) -> dict[str, Any]:
        self.gets += 1
        if self.errors:
            raise self.errors.pop(0)
        try:
            return self.objects[(namespace or "", name)]
        except KeyError:
            raise KubeNotFoundError(f"get {rt.plural}/{name}: 404", status=404) from None


ClaimFactory = Callable[..., dict[str, Any]]
InventoryFactory = Callable[..., inventory_pb2.Inventory]


@pytest.fixture
def make_claim() -> ClaimFactory:
    """`make_claim(uid=..., devices=[...], allocated=..., ...)`: a ResourceClaim object."""
    return claim_object


@pytest.fixture
def make_inventory() -> InventoryFactory:
    """`make_inventory("npu-0", ...)`: an Inventory of Ascend-like sim devices."""
    return inventory


@pytest.fixture
def kube_reader() -> FakeKubeReader:
    return FakeKubeReader()
