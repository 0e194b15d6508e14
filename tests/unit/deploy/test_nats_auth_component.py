"""The nats-auth Component: the server demands a token, every agent reads it from a mounted
Secret (NATS_TOKEN_FILE), and a real nats-server with the Component's config lets such an
agent's Bus in and nobody else."""

from __future__ import annotations

import os
import secrets
import stat
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import structlog
import yaml

from services.devcluster.natsserver import NATSServerProcess
from shared.config import NATSSettings
from tests.integration.security.secure_nats import eventually, exercise, logged, running_bus
from tests.unit.deploy.manifests import (
    KUBE_VERSIONS,
    KUBECTL,
    KUSTOMIZE,
    _assert_agent_accepts,
    _assert_env_names_are_flags,
    _container,
    _docs,
    _env,
    _of_kind,
    _resolved_env,
)

COMPONENT = KUSTOMIZE / "components" / "nats-auth"
SECRET = "dra-suite-nats-auth"


def _patched_agents() -> list[dict[str, Any]]:
    return [
        d
        for p in sorted(COMPONENT.glob("*-patch.yaml"))
        for d in _docs(p)
        if d["kind"] == "DaemonSet"
    ]


def _token_mount(ds: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Where the agent reads its token, and the Secret volume that file comes from."""
    token_file = _env(ds)["NATS_TOKEN_FILE"]["value"]
    container = _container(ds)
    (mount,) = [m for m in container["volumeMounts"] if token_file.startswith(m["mountPath"] + "/")]
    (volume,) = [v for v in ds["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"]]
    assert mount["readOnly"] is True
    return token_file.removeprefix(mount["mountPath"] + "/"), volume


def test_every_agent_reads_the_token_from_the_secret_mounted_as_a_file():
    agents = _patched_agents()
    assert sorted(_container(ds)["name"] for ds in agents) == ["allocation", "discovery", "health"]
    for ds in agents:
        _assert_env_names_are_flags(ds)
        assert not {"NATS_TOKEN", "NATS_PASSWORD"} & _env(ds).keys(), "secrets only as files"
        file_name, volume = _token_mount(ds)
        assert volume["secret"]["secretName"] == SECRET
        assert {"key": "token", "path": file_name} in volume["secret"]["items"]
        assert volume["secret"]["defaultMode"] & (stat.S_IRWXO | stat.S_IWGRP) == 0


def test_non_root_agents_get_the_group_that_may_read_the_secret_files():
    base = {
        _container(ds)["name"]: ds
        for p in sorted((KUSTOMIZE / "base").glob("daemonset-*.yaml"))
        for ds in _docs(p)
    }
    for ds in _patched_agents():
        name = _container(ds)["name"]
        run_as = base[name]["spec"]["template"]["spec"]["securityContext"]
        if run_as.get("runAsUser", 0) != 0:
            patched = ds["spec"]["template"]["spec"]["securityContext"]
            assert patched["fsGroup"] == run_as["runAsGroup"], name


def _server_config() -> str:
    (config_map,) = _docs(COMPONENT / "nats-auth-config.yaml")
    return str(config_map["data"]["auth.conf"])


def test_the_server_takes_its_token_from_the_same_secret():
    (statefulset,) = _docs(COMPONENT / "nats-patch.yaml")
    container = _container(statefulset)
    args = container["args"]
    config_path = args[args.index("--config") + 1]
    (mount,) = [m for m in container["volumeMounts"] if config_path.startswith(m["mountPath"])]
    (volume,) = [
        v for v in statefulset["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"]
    ]
    assert volume["configMap"]["name"] == "nats-auth-config"
    assert {"--jetstream", "--store_dir"} <= set(args)
    (token,) = [e for e in container["env"] if e["name"] == "NATS_AUTH_TOKEN"]
    assert token["valueFrom"]["secretKeyRef"] == {"name": SECRET, "key": "token"}
    assert "$NATS_AUTH_TOKEN" in _server_config()


@pytest.mark.integration
async def test_a_real_nats_server_with_the_components_config_admits_the_token_file(
    tmp_path, monkeypatch
):
    token = secrets.token_hex(24)
    config = tmp_path / "auth.conf"
    config.write_text(_server_config())
    token_file = tmp_path / "secret" / "token"  # as the Secret volume lays it out
    token_file.parent.mkdir()
    token_file.write_text(token + "\n")
    monkeypatch.setenv("NATS_AUTH_TOKEN", token)  # what the secretKeyRef gives the server
    server = NATSServerProcess(tmp_path / "nats", extra_args=("--config", str(config)))
    server.start()
    try:
        with structlog.testing.capture_logs() as bus_events:
            settings = NATSSettings(url=server.url, namespace="deploy", token_file=str(token_file))
            async with running_bus(settings) as run:
                await eventually(run.bus.connected.is_set)
                await exercise(run.bus)
            async with running_bus(NATSSettings(url=server.url, namespace="deploy")):
                await eventually(lambda: logged(bus_events, "nats_auth_rejected"))
    finally:
        server.stop()
    assert token not in repr(bus_events)


needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not on PATH")


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    """The sim overlay with the Component, as a user's kustomization would combine them."""
    assert KUBECTL is not None
    with tempfile.TemporaryDirectory() as tmp:
        kustomization = {
            "resources": [os.path.relpath(KUSTOMIZE / "overlays" / "sim", tmp)],
            "components": [os.path.relpath(COMPONENT, tmp)],
        }
        Path(tmp, "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
        result = subprocess.run(
            [KUBECTL, "kustomize", tmp], capture_output=True, text=True, timeout=60, check=False
        )
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


@needs_kubectl
@pytest.mark.parametrize("version", KUBE_VERSIONS)
def test_the_overlay_with_the_component_is_valid_kubernetes(rendered, version):
    for obj in rendered:
        kubernetes_validate.validate(obj, version, strict=True)


@needs_kubectl
def test_each_agent_of_the_rendered_overlay_accepts_its_env(rendered, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("from-the-secret\n")
    daemonsets = _of_kind(rendered, "DaemonSet")
    assert len(daemonsets) == 3
    for ds in daemonsets:
        env = _resolved_env(ds)
        assert env["NATS_TOKEN_FILE"] == "/etc/dra-suite/nats/token"
        _token_mount(ds)
        _assert_agent_accepts(_container(ds)["name"], {**env, "NATS_TOKEN_FILE": str(token_file)})
