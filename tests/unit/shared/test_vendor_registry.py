"""Every agent's vendor table names exactly the backends of `shared/vendors/registry.py`."""

from __future__ import annotations

from collections.abc import Callable, Collection
from pathlib import Path

import pytest

from services.allocation import cli as allocation_cli
from services.allocation.cdi import allowlist, edits
from services.allocation.config import AllocationConfig
from services.allocation.deviceplugin import resources
from services.allocation.partitions import by_backend
from services.discovery import backends
from services.discovery import cli as discovery_cli
from services.health import cli as health_cli
from services.health import monitors
from shared.errors import ConfigError
from shared.vendors import registry

NAMES = set(registry.NAMES)


def test_the_registry_names_each_backend_once_with_its_vendor_package():
    assert registry.NAMES == ("sim", "nvml", "ascend")
    assert {b.vendor for b in registry.BACKENDS.values()} == {"sim", "nvidia", "ascend"}


@pytest.mark.parametrize(
    "table",
    [
        pytest.param(backends.LOADERS, id="discovery-backends"),
        pytest.param(monitors.FACTORIES, id="health-monitors"),
        pytest.param(edits.BACKENDS, id="cdi-edits"),
        pytest.param(allowlist.BACKENDS, id="allowlist"),
        pytest.param(resources.VENDOR_NAMES, id="device-plugin-names"),
    ],
)
def test_every_agent_table_names_exactly_the_registry_backends(table: Collection[str]):
    assert set(table) == NAMES


def test_each_backend_has_exactly_one_partition_manager(tmp_path: Path):
    composite = by_backend.build(AllocationConfig(node_name="n1", plugin_data_dir=tmp_path))
    for name in registry.NAMES:
        assert sum(m.supports(name) for m in composite.managers) == 1, name
    assert not any(m.supports("cuda") for m in composite.managers)


@pytest.mark.parametrize("name", ["", "NVML", "cuda", "sim ", "x" * 300])
def test_require_refuses_any_other_name_as_a_configuration_error(name: str):
    with pytest.raises(ConfigError, match="is not one of sim, nvml, ascend") as caught:
        registry.require(name)
    assert caught.value.field == "backend"
    assert len(str(caught.value)) < 160  # a long forged name is cut in the message


AGENT_MAINS: dict[str, tuple[Callable[[list[str]], None], list[str]]] = {
    "discovery": (discovery_cli.main, ["--node-name", "n1", "--backend", "cuda"]),
    "allocation": (allocation_cli.main, ["--node-name", "n1", "--backend", "cuda"]),
    "health": (health_cli.main, ["--node-name", "n1", "--monitor", "cuda"]),
}


@pytest.mark.parametrize("agent", sorted(AGENT_MAINS))
def test_every_agent_exits_2_on_a_backend_outside_the_registry(
    agent: str, capsys: pytest.CaptureFixture[str]
):
    main, argv = AGENT_MAINS[agent]
    with pytest.raises(SystemExit) as caught:
        main(argv)
    assert caught.value.code == 2
    assert "'cuda' is not one of sim, nvml, ascend" in capsys.readouterr().err
