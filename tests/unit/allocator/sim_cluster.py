"""ResourceSlices of sim nodes as the discovery agent builds them, and the sim overlay's classes."""

from __future__ import annotations

import copy
from typing import Any

import yaml

from services.discovery import apirules, inventory, slices
from shared.vendors.parts.discovery import Scan
from shared.vendors.sim.discovery import SimBackend
from tests.unit.deploy.manifests import KUSTOMIZE

DRIVER = "sim.dra-suite.io"
Obj = dict[str, Any]


async def node_slices(node: str, *, profile: str = "mixed", driver: str = DRIVER) -> list[Obj]:
    """The node's slices (pool = node name), valid for the API emulator."""
    return scan_slices(await SimBackend.from_profile(profile).scan(), node=node, driver=driver)


def scan_slices(
    scan: Scan,
    *,
    node: str,
    driver: str = DRIVER,
    backend: str = "sim",
    rules: apirules.PublishRules = slices.NEWEST_RULES,
) -> list[Obj]:
    """The slices the discovery agent publishes for `scan` (pool = node name) under `rules`."""
    identity = inventory.Identity(driver=driver, node=node, pool=node, backend=backend)
    pool = slices.desired(inventory.build(scan, identity=identity, scanned_unix_ms=0), rules=rules)
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
