"""The open bus exists only in the development stacks, and each says so: `devcluster up` prints
the warning first, the compose file carries it where its NATS and agents are declared, and
neither gives its agents bus credentials that would suggest otherwise."""

from __future__ import annotations

import io
from pathlib import Path

import yaml

from devcluster import up
from devcluster.stack import AGENTS, OPEN_BUS_WARNING, StackConfig
from tests.unit.deploy.manifests import NATS_AUTH_ENV, REPO


def test_the_warning_names_what_is_open_and_where_it_is_not():
    for words in ("no authentication", "no TLS", "127.0.0.1", "deploy/kustomize"):
        assert words in OPEN_BUS_WARNING


def test_up_prints_the_warning_before_its_endpoints(tmp_path: Path):
    config = StackConfig(workdir=tmp_path)
    endpoints = {
        "nats_url": "nats://127.0.0.1:4222",
        "api_url": "http://127.0.0.1:6443",
        "kubeconfig": str(config.kubeconfig),
        "cdi_dir": str(config.cdi_root),
        "plugin_registry_dir": str(config.registry_dir),
        "logs_dir": str(config.logs_dir),
        "driver": config.driver_name,
        "node": config.node_name,
        "ops": dict.fromkeys(AGENTS, "http://127.0.0.1:9100"),
    }
    out = io.StringIO()
    up._print_endpoints(endpoints, config=config, out=out)
    assert out.getvalue().startswith(OPEN_BUS_WARNING + "\n")


def test_compose_says_its_bus_is_open_and_gives_no_agent_credentials():
    text = (REPO / "docker-compose.yml").read_text()
    header = text.split("\nname:", 1)[0]
    assert "WARNING: OPEN BUS" in header
    services = yaml.safe_load(text)["services"]
    command = services["nats"]["command"]
    assert not {"--config", "-c", "--auth", "--user", "--tls"} & set(command), "really open"
    for agent in AGENTS:
        assert not NATS_AUTH_ENV & set(services[agent]["environment"]), agent
