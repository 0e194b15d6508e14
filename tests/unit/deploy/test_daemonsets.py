"""RBAC and DaemonSets: no wildcard, bindings (the grants themselves are compared with the
agents' measured API calls in test_rbac_least_privilege.py), env names that are real agent
flags, probes run against real sockets, and the kubelet's socket-path contract (docs/contracts.md
2.1)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import socket
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path
from typing import Any

import grpc
import pytest

from shared.config import env_name
from shared.pb.kubelet.pluginregistration.v1 import api_pb2 as reg_pb2
from shared.pb.kubelet.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from tests.unit.deploy.manifests import (
    AGENT_ENV,
    AGENT_OBJECTS,
    AGENT_SHUTDOWN_S,
    BASE_DAEMONSETS,
    CONFIG_BUILDERS,
    DAEMONSETS,
    OBJECTS,
    REPO,
    _assert_agent_accepts,
    _assert_env_names_are_flags,
    _assert_rbac_has_no_wildcard,
    _container,
    _env,
    _ids,
    _of_kind,
    _resolved_env,
)

# --- RBAC ---------------------------------------------------------------------------------


def test_rbac_rules_name_no_wildcard() -> None:
    _assert_rbac_has_no_wildcard(d for _, d in OBJECTS)


BUILTIN_ROLES = {"system:auth-delegator", "system:service-account-issuer-discovery"}
"""Kubernetes' own roles a binding may name: the auth service's TokenReviews and its reads of
the token issuer's OIDC discovery and JWKS."""
BUILTIN_ACCOUNTS = {"default"}
"""The account Kubernetes makes in every namespace: NATS and the collector run as it
(components/openshift lets it use an SCC)."""


def test_bindings_tie_each_account_to_its_role() -> None:
    docs = [d for _, d in AGENT_OBJECTS]
    accounts = {
        (d["metadata"]["namespace"], d["metadata"]["name"])
        for d in _of_kind(docs, "ServiceAccount")
    }
    roles = {d["metadata"]["name"] for d in _of_kind(docs, "ClusterRole") + _of_kind(docs, "Role")}
    for binding in _of_kind(docs, "ClusterRoleBinding") + _of_kind(docs, "RoleBinding"):
        assert binding["roleRef"]["name"] in roles | BUILTIN_ROLES
        for subject in binding["subjects"]:
            if subject["kind"] == "ServiceAccount":
                assert (subject["namespace"], subject["name"]) in accounts or (
                    subject["name"] in BUILTIN_ACCOUNTS
                )
            else:  # the operators' group: may mint the operator's bus token, nothing more
                assert (subject["kind"], binding["roleRef"]["kind"]) == ("Group", "Role")
    for workload in _of_kind(docs, "DaemonSet") + _of_kind(docs, "Deployment"):
        account = workload["spec"]["template"]["spec"].get("serviceAccountName")
        if account is not None:
            assert (workload["metadata"]["namespace"], account) in accounts


# --- DaemonSets ---------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "ds"), DAEMONSETS, ids=_ids(DAEMONSETS))
def test_daemonset_env_names_are_its_agents_flags(name: str, ds: dict[str, Any]) -> None:
    _assert_env_names_are_flags(ds)


def _env_twins(config: Any) -> set[str]:
    twins = set()
    for field in dataclasses.fields(config):
        if "flag" in field.metadata:
            twins.add(env_name(field.metadata["flag"]))
        elif dataclasses.is_dataclass(value := getattr(config, field.name)):
            twins |= _env_twins(value)
    return twins


@pytest.mark.parametrize("agent", sorted(AGENT_ENV))
def test_env_names_the_deployments_may_set_are_real_agent_flags(agent: str) -> None:
    config = CONFIG_BUILDERS[agent]([], {"NODE_NAME": "node-a"})
    assert AGENT_ENV[agent] <= _env_twins(config)


@pytest.mark.parametrize(("name", "ds"), BASE_DAEMONSETS, ids=_ids(BASE_DAEMONSETS))
def test_agent_accepts_the_env_its_daemonset_gives_it(name: str, ds: dict[str, Any]) -> None:
    _assert_agent_accepts(_container(ds)["name"], _resolved_env(ds))


@pytest.mark.parametrize(("name", "ds"), BASE_DAEMONSETS, ids=_ids(BASE_DAEMONSETS))
def test_daemonset_runs_its_agent_with_node_name_resources_probes_and_grace(
    name: str, ds: dict[str, Any]
) -> None:
    pod, container = ds["spec"]["template"]["spec"], _container(ds)
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert container["command"] == [f"dra-{container['name']}"]
    assert container["command"][0] in scripts
    assert _env(ds)["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    for bound in ("requests", "limits"):
        assert {"cpu", "memory"} <= container["resources"][bound].keys()
    assert {"readinessProbe", "livenessProbe"} <= container.keys()
    assert pod["terminationGracePeriodSeconds"] > AGENT_SHUTDOWN_S


def _allocation() -> dict[str, Any]:
    (ds,) = [d for _, d in BASE_DAEMONSETS if d["metadata"]["name"] == "dra-allocation"]
    return ds


def test_allocation_mounts_kubelet_dirs_at_their_host_paths() -> None:
    pod, container = _allocation()["spec"]["template"]["spec"], _container(_allocation())
    host = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    same = {
        m["mountPath"] for m in container["volumeMounts"] if host.get(m["name"]) == m["mountPath"]
    }
    env = _env(_allocation())
    driver = env["DRIVER_NAME"]["value"]
    own = f"/var/lib/kubelet/plugins/{driver}"
    assert same == {"/var/lib/kubelet/plugins_registry", own, "/var/run/cdi"}
    resolved = _resolved_env(_allocation())
    assert resolved["PLUGIN_DATA_DIR"] == own, "only its own driver's directory"
    for var in ("PLUGIN_REGISTRY_DIR", "PLUGIN_DATA_DIR", "CDI_ROOT"):
        assert resolved[var] in same, var


def test_allocation_is_ready_only_once_the_kubelet_registered_it() -> None:
    """Rolling updates surge: the old pod goes when the new one is Ready, which must mean the
    kubelet has the new one registered (the agent's /readyz), not merely that its sockets
    exist."""
    container = _container(_allocation())
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    probe = container["readinessProbe"]["httpGet"]
    assert probe["path"] == "/readyz"
    assert ports[probe["port"]] == int(_env(_allocation())["OPS_PORT"]["value"])
    strategy = _allocation()["spec"]["updateStrategy"]["rollingUpdate"]
    assert (strategy["maxSurge"], strategy["maxUnavailable"]) == (1, 0)


class _Registration(reg_grpc.RegistrationServicer):
    def __init__(self, driver: str) -> None:
        self.driver = driver

    async def GetInfo(self, request: Any, context: Any) -> reg_pb2.PluginInfo:
        return reg_pb2.PluginInfo(type="DRAPlugin", name=self.driver, endpoint="/x/dra.sock")

    async def NotifyRegistrationStatus(
        self, request: Any, context: Any
    ) -> reg_pb2.RegistrationStatusResponse:
        return reg_pb2.RegistrationStatusResponse()


async def _serve(path: str, driver: str) -> grpc.aio.Server:
    server = grpc.aio.server()
    reg_grpc.add_RegistrationServicer_to_server(_Registration(driver), server)
    server.add_insecure_port("unix:" + path)
    await server.start()
    return server


def _plugin_dirs(root: str, driver: str) -> tuple[Path, Path]:
    registry, data = Path(root, "registry"), Path(root, "plugins", driver)
    registry.mkdir()
    data.mkdir(parents=True)
    return registry, data


def _dead_socket(path: str) -> None:
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(path)  # the file stays behind, nothing listens on it


PROBE_CASES = [  # (probe, registration socket, DRA socket, exit code 0?)
    ("livenessProbe", "serving", "dead", True),
    ("livenessProbe", "dead", "dead", False),
    ("livenessProbe", "missing", "missing", False),
    ("startupProbe", "dead", "dead", True),
    ("startupProbe", "dead", "missing", False),
    ("startupProbe", "missing", "dead", False),
]


@pytest.mark.parametrize(
    "uid", ["6f1c0a6e-3b1f-4d1e-9a55-1b2c3d4e5f60", ""], ids=["rolling-update uid", "no uid"]
)
@pytest.mark.parametrize(
    ("probe", "registration", "dra", "passes"),
    PROBE_CASES,
    ids=[
        "liveness passes when the registration socket answers GetInfo",
        "liveness fails on a registration socket nobody serves",
        "liveness fails without a registration socket",
        "startup passes when both sockets exist",
        "startup fails without the DRA socket",
        "startup fails without the registration socket",
    ],
)
async def test_allocation_probe_checks_the_plugin_sockets(
    probe: str, registration: str, dra: str, passes: bool, uid: str
) -> None:
    driver = "sim.dra-suite.io"
    with tempfile.TemporaryDirectory(prefix="dra-") as tmp:  # short: unix socket paths
        reg_dir, data_dir = _plugin_dirs(tmp, driver)
        suffix = f"-{uid}" if uid else ""  # the agent's names (AllocationConfig)
        reg_sock = str(reg_dir / f"{driver}{suffix}-reg.sock")
        dra_sock = str(data_dir / f"dra{suffix}.sock")
        server = await _serve(reg_sock, driver) if registration == "serving" else None
        for state, path in ((registration, reg_sock), (dra, dra_sock)):
            if state == "dead":
                _dead_socket(path)
        command = list(_container(_allocation())[probe]["exec"]["command"])
        command[0] = sys.executable if command[0] == "python" else command[0]
        env = {
            "PATH": os.environ["PATH"],
            "PYTHONPATH": str(REPO),
            "DRIVER_NAME": driver,
            "PLUGIN_REGISTRY_DIR": str(reg_dir),
            "PLUGIN_DATA_DIR": str(data_dir),
            "ROLLING_UPDATE_UID": uid,
        }
        try:
            proc = await asyncio.create_subprocess_exec(
                *command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
            _, err = await asyncio.wait_for(proc.communicate(), 30)
        finally:
            if server is not None:
                await server.stop(None)
    assert (proc.returncode == 0) == passes, err.decode()
