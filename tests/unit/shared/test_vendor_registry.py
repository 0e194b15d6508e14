"""Every agent reaches vendor code through `shared/vendors/registry.py`, and nothing else.

The registry maps each backend name to its vendor package's `Vendor`; each agent's lookup
(discovery's backend loader, the health monitor, the partition managers, the CDI edits and
allowlist, the device-plugin names) must name exactly its backends, and a vendor package must
never reach into an agent.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Callable, Collection, Iterator
from pathlib import Path

import pytest

from services.allocation import cli as allocation_cli
from services.allocation.cdi import allowlist, edits
from services.allocation.config import AllocationConfig
from services.allocation.deviceplugin import resources
from services.allocation.partitions import by_backend
from services.discovery import backends
from services.discovery import cli as discovery_cli
from services.discovery.config import DiscoveryConfig
from services.health import cli as health_cli
from services.health import monitors
from shared.errors import BackendLoadError, ConfigError
from shared.pb.drasuite.v1 import inventory_pb2
from shared.vendors import registry
from shared.vendors.parts.vendor import Vendor

NAMES = set(registry.NAMES)
REPO = Path(__file__).resolve().parents[3]
VENDORS = REPO / "shared" / "vendors"


def test_the_registry_names_each_backend_once_with_its_vendor_package():
    assert registry.NAMES == ("sim", "nvml", "ascend")
    assert {v.package for v in registry.BACKENDS.values()} == {"sim", "nvidia", "ascend"}
    for name, vendor in registry.BACKENDS.items():
        assert isinstance(vendor, Vendor)
        assert vendor.name == name
        assert (VENDORS / vendor.package / "__init__.py").is_file()


@pytest.mark.parametrize("name", registry.NAMES)
def test_each_vendor_object_bundles_every_part(name: str):
    vendor = registry.BACKENDS[name]
    for part in dataclasses.fields(vendor):
        assert getattr(vendor, part.name) is not None, part.name
    for factory in (vendor.load_backend, vendor.monitor, vendor.partitions, vendor.edits):
        assert callable(factory)


@pytest.mark.parametrize(
    "table",
    [
        pytest.param(edits.BACKENDS, id="cdi-edits"),
        pytest.param(allowlist.BACKENDS, id="allowlist"),
    ],
)
def test_every_agent_table_names_exactly_the_registry_backends(table: Collection[str]):
    assert set(table) == NAMES


def test_each_backend_has_exactly_one_partition_manager(tmp_path: Path):
    composite = by_backend.build(AllocationConfig(node_name="n1", plugin_data_dir=tmp_path))
    for name in registry.NAMES:
        assert sum(m.supports(name) for m in composite.managers) == 1, name
    assert not any(m.supports("cuda") for m in composite.managers)


@pytest.mark.parametrize("name", registry.NAMES)
def test_the_device_plugin_names_devices_of_every_backend(name: str):
    device = inventory_pb2.Device(name="gpu-0", kind="gpu")
    assert resources.resource_name(device, backend=name, driver="d.io", overrides={})


def test_the_agents_refuse_a_backend_outside_the_registry():
    config = DiscoveryConfig(node_name="n1")
    object.__setattr__(config, "backend", "cuda")  # past the settings' own check
    with pytest.raises(BackendLoadError):
        backends.load_backend(config)
    with pytest.raises(BackendLoadError):
        monitors.load("cuda", bus=None, driver="d.io", node="n1")  # type: ignore[arg-type]


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


def _imported_modules(path: Path) -> Iterator[tuple[int, str]]:
    """Every module `path` imports, lazily and under TYPE_CHECKING included."""
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module


def _services_imports(root: Path) -> list[str]:
    return [
        f"{path.relative_to(REPO)}:{line}: {module}"
        for path in sorted(root.rglob("*.py"))
        for line, module in _imported_modules(path)
        if module == "services" or module.startswith("services.")
    ]


def test_no_vendor_package_imports_an_agent():
    assert _services_imports(VENDORS) == []


def test_the_import_check_catches_a_vendor_module_that_imports_an_agent(tmp_path: Path):
    rogue = tmp_path / "rogue.py"
    rogue.write_text("def load():\n    from services.discovery import config\n")
    found = [module for _, module in _imported_modules(rogue)]
    assert found == ["services.discovery"]
