"""ResourceSlices of sim nodes as the discovery agent builds them, and the sim overlay's classes."""

from __future__ import annotations

import copy
from typing import Any

import yaml

from services.discovery import inventory, slices
from services.discovery.backends.sim import SimBackend
from tests.unit.deploy.manifests import KUSTOMIZE

DRIVER = "sim.dra-suite.io"
Obj = dict[str, Any]


async def node_slices(node: str, *, profile: str = "mixed", driver: str = DRIVER) -> list[Obj]:
    """The node's slices (pool = node name), valid for the API emulator."""
    scan = await SimBackend.from_profile(profile).scan()
    identity = inventory.Identity(driver=driver, node=node, pool=node, backend="sim")
    pool = slices.desired(inventory.build(scan, identity=identity, scanned_unix_ms=0))
    assert not pool.rejected
    count = len(pool.contents)
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"{i:05x}-{driver}-{node}"},
            "spec": {
                "driver": driver,
                "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": count},
                **copy.deepcopy(content),
            },
        }
        for i, content in enumerate(pool.contents)
    ]


def sim_classes() -> list[Obj]:
    path = KUSTOMIZE / "overlays" / "sim" / "deviceclasses.yaml"
    return [d for d in yaml.safe_load_all(path.read_text()) if d and d["kind"] == "DeviceClass"]
