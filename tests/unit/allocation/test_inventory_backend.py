"""Issue 20 item 6: the backend comes from the node's own configuration, never from the bus.

An inventory naming another backend than the agent's `--backend` is refused (counted, logged
with `security=true`) from the bus and from the disk copy, even as the first inventory ever;
an unknown backend setting is a configuration error (exit 2).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import structlog

from services.allocation import cli
from services.allocation.config import AllocationConfig
from services.allocation.node_view.inventory_cache import BACKEND_MISMATCH, InventoryCache
from shared import atomicfile, metrics
from shared.bus import codec
from shared.errors import ConfigError
from shared.pb.drasuite.v1 import inventory_pb2

DRIVER = "sim.dra-suite.io"
NODE = "node-a"


def _inventory(generation: int, backend: str) -> inventory_pb2.Inventory:
    device = inventory_pb2.Device(name="gpu-0", kind="gpu", uuid="GPU-0a1b")
    device.device_nodes.add(path="/dev/nvidia0", host_path="/dev/null")
    return inventory_pb2.Inventory(
        driver=DRIVER, node=NODE, pool=NODE, backend=backend, generation=generation,
        devices=[device],
    )  # fmt: skip


def _refused() -> float:
    metrics.configure(service="test")
    line = f'dra_inventory_rejected_total{{reason="{BACKEND_MISMATCH}"}} '
    texts = metrics.render().decode().splitlines()
    return sum(float(t.removeprefix(line)) for t in texts if t.startswith(line))


async def test_a_first_inventory_of_another_backend_is_refused_and_logged(tmp_path: Path):
    cache = InventoryCache(tmp_path / "inventory.pb", driver=DRIVER, node=NODE, backend="sim")
    before = _refused()
    with structlog.testing.capture_logs() as events:
        assert not await cache.update(_inventory(1, "nvml"))
    assert cache.current is None
    assert not cache.path.exists()
    assert _refused() - before == 1.0
    (event,) = [e for e in events if e["event"] == "inventory_refused"]
    assert (event["security"], event["reason"], event["backend"]) == (
        True,
        BACKEND_MISMATCH,
        "nvml",
    )
    assert event["own_backend"] == "sim"
    assert event["log_level"] == "warning"


async def test_a_later_inventory_of_another_backend_keeps_the_good_one(tmp_path: Path):
    cache = InventoryCache(tmp_path / "inventory.pb", driver=DRIVER, node=NODE, backend="sim")
    good = _inventory(1, "sim")
    assert await cache.update(good)
    assert not await cache.update(_inventory(2, "nvml"))
    assert not await cache.update(_inventory(3, ""))
    assert cache.current == good


def test_a_disk_copy_of_another_backend_is_not_loaded(tmp_path: Path):
    path = tmp_path / "inventory.pb"
    atomicfile.write_atomic(path, codec.encode(_inventory(4, "ascend")))
    cache = InventoryCache(path, driver=DRIVER, node=NODE, backend="sim")
    before = _refused()
    cache.load()
    assert cache.current is None
    assert _refused() - before == 1.0


@pytest.mark.parametrize("backend", ["sim", "nvml", "ascend"])
def test_the_backend_setting_takes_each_backend(backend: str):
    config = cli.build_config(["--node-name", NODE, "--backend", backend], {})
    assert config.backend == backend
    assert cli.build_config(["--node-name", NODE], {"BACKEND": backend}).backend == backend


@pytest.mark.parametrize("backend", ["", "NVML", "cuda", "sim "])
def test_an_unknown_backend_setting_is_a_configuration_error(backend: str):
    with pytest.raises(ConfigError, match="backend") as caught:
        AllocationConfig(node_name=NODE, backend=backend)
    assert caught.value.field == "backend"


def test_an_unknown_backend_flag_exits_2(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit) as caught:
        cli.main(["--node-name", NODE, "--backend", "forged"])
    assert caught.value.code == 2
    assert "backend 'forged' is not one of sim, nvml, ascend" in capsys.readouterr().err
