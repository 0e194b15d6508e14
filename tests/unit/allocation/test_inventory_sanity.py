"""Inventory sanity in the allocation agent: an empty inventory and a generation that goes
backwards (or is reused for other content) are quarantined, counted and logged; the last good
inventory stays in memory and on disk."""

from __future__ import annotations

from pathlib import Path

import pytest
import structlog

from services.allocation.node_view.inventory_cache import InventoryCache
from shared import inventory_sanity as sanity
from shared import metrics
from shared.pb.drasuite.v1 import inventory_pb2

DRIVER = "sim.dra-suite.io"
NODE = "node-a"


def _inventory(generation: int, *names: str, backend: str = "sim") -> inventory_pb2.Inventory:
    return inventory_pb2.Inventory(
        driver=DRIVER,
        node=NODE,
        pool=NODE,
        backend=backend,
        generation=generation,
        devices=[inventory_pb2.Device(name=name, kind="npu") for name in names],
    )


def _rejected(reason: str) -> float:
    metrics.configure(service="test")
    line = f'dra_inventory_rejected_total{{reason="{reason}"}} '
    # Summed: tests run the allocation and health agents' counters of this name in one process.
    texts = metrics.render().decode().splitlines()
    return sum(float(t.removeprefix(line)) for t in texts if t.startswith(line))


@pytest.mark.parametrize(
    ("inventory", "last", "reason"),
    [
        (_inventory(5), _inventory(4, "npu-0"), "empty"),
        (_inventory(1), None, "empty"),
        (_inventory(3, "npu-0"), _inventory(4, "npu-0"), "generation_backwards"),
        (_inventory(4, "npu-0", "npu-1"), _inventory(4, "npu-0"), "generation_reused"),
        (_inventory(5, "npu-0"), _inventory(4, "npu-0", "npu-1"), None),
        (_inventory(4, "npu-0"), _inventory(4, "npu-0"), None),
        (_inventory(1, "npu-0"), None, None),
        (_inventory(5, "npu-0", backend="nvml"), _inventory(4, "npu-0"), "backend_changed"),
    ],
    ids=[
        "empty",
        "empty-first",
        "backwards",
        "reused",
        "next-generation",
        "same-again",
        "first",
        "backend-changed",
    ],
)
def test_sanity_rules(inventory, last, reason):
    assert sanity.problem(inventory, last=last, same_backend=True) == reason


async def test_the_cache_keeps_the_last_good_inventory_on_disk_and_in_memory(tmp_path: Path):
    path = tmp_path / "inventory.pb"
    cache = InventoryCache(path, driver=DRIVER, node=NODE, backend="sim")
    good = _inventory(7, "npu-0", "npu-1")
    assert await cache.update(good)
    before = {r: _rejected(r) for r in sanity.REASONS}
    with structlog.testing.capture_logs() as events:
        assert not await cache.update(_inventory(8))
        assert not await cache.update(_inventory(6, "npu-0"))
        assert not await cache.update(_inventory(7, "npu-0"))
    assert cache.current == good
    reloaded = InventoryCache(path, driver=DRIVER, node=NODE, backend="sim")
    reloaded.load()
    assert reloaded.current == good
    assert {r: _rejected(r) - before[r] for r in sanity.REASONS} == {
        "empty": 1.0,
        "generation_backwards": 1.0,
        "generation_reused": 1.0,
        "backend_changed": 0.0,
    }
    quarantined = [e for e in events if e["event"] == "inventory_quarantined"]
    assert [(e["reason"], e["generation"], e["kept_generation"]) for e in quarantined] == [
        ("empty", 8, 7),
        ("generation_backwards", 6, 7),
        ("generation_reused", 7, 7),
    ]
    assert await cache.update(_inventory(8, "npu-0"))
    assert cache.device_names() == ["npu-0"]


def test_a_reader_that_does_not_depend_on_the_backend_accepts_its_change():
    # The health agent's rules: a new backend alone is no reason to keep the old inventory.
    last = _inventory(3, "npu-0")
    moved = _inventory(4, "npu-0", backend="ascend")
    assert sanity.problem(moved, last=last) is None
    assert sanity.problem(moved, last=last, same_backend=True) == "backend_changed"
