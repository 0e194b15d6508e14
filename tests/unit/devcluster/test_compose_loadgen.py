"""The compose stack's load generator runs `devcluster load` with flags that exist and finds
the stack through env twins of those flags (it has no `devcluster up` work dir)."""

from __future__ import annotations

from pathlib import Path

import yaml

from devcluster import cli

COMPOSE = Path(__file__).parents[3] / "docker-compose.yml"


def test_the_loadgen_command_parses_and_its_env_names_the_stack() -> None:
    service = yaml.safe_load(COMPOSE.read_text())["services"]["loadgen"]
    program, argv = service["command"][:3], service["command"][3:]
    assert program == ["python", "-m", "devcluster"]
    args = cli._parser().parse_args(argv)
    assert args.command == "load"
    assert set(service["environment"]) == {
        "KUBECONFIG",
        "NATS_URL",
        "PLUGIN_REGISTRY_DIR",
        "DRIVER_NAME",
        "NODE_NAME",
    }
    mounted = {volume.split(":")[1] for volume in service["volumes"]}
    assert service["environment"]["PLUGIN_REGISTRY_DIR"] in mounted
    assert service["environment"]["KUBECONFIG"] in mounted
