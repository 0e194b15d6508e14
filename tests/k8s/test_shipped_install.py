"""The shipped install on the real API server: the rendered sim overlay (RBAC, admission
policies, DeviceClasses, DaemonSets) and the examples pass strict server-side validation, and
the discovery agent, holding only its own ServiceAccount's token bound to a pod on its node,
publishes slices through its rendered ClusterRole while the node-scoped admission policy
refuses it another node's slices, with the user info the real API server gives it. The
callout Secret and the certify key's ConfigMap, made by the documented commands (a fresh
install, and an upgrade that adds the key to an older Secret), hold every key the pods mount,
and the auth service and the agents run signed records in enforce with them."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from devcluster.controlplane import RealControlPlane, register_node
from devcluster.controlplane.nodes import wait_for_service_account
from services.discovery.agent import DiscoveryAgent
from services.discovery.config import DiscoveryConfig
from services.natsauth import cli as auth_cli
from services.natsauth import secrets as natsauth_secrets
from shared import signature_settings
from shared.config import KubeSettings, NATSSettings
from shared.errors import KubeError
from shared.kube.client import KubeClient
from shared.kube.resources import RESOURCE_SLICES, ResourceType
from shared.vendors.sim import discovery as sim
from tests.integration.discovery.agent_runner import running
from tests.k8s.apply import Applier
from tests.k8s.tokens import pod_bound_token
from tests.unit.deploy.manifests import (
    AUTH_KEY_CONFIGMAP,
    CALLOUT_SECRET,
    CONFIG_BUILDERS,
    KUBECTL,
    KUSTOMIZE,
    REPO,
    _container,
    _of_kind,
    _resolved_env,
    local_env,
    render,
)

pytestmark = [
    pytest.mark.k8s,
    pytest.mark.skipif(KUBECTL is None, reason="kubectl renders the overlays"),
]

DRIVER = "sim.dra-suite.io"
NAMESPACE = "dra-suite"
SERVICE_ACCOUNTS = ResourceType("", "v1", "serviceaccounts", "ServiceAccount", namespaced=True)
AUTH = "dra-nats-auth"
SECRETS = ResourceType("", "v1", "secrets", "Secret", namespaced=True)
CONFIG_MAPS = ResourceType("", "v1", "configmaps", "ConfigMap", namespaced=True)
_nodes = itertools.count(1)
Obj = dict[str, Any]


def _overlay(minor: int) -> tuple[dict[str, Any], ...]:
    components = ("overlays/sim/k8s-1.36",) if minor >= 36 else ()
    return render("overlays/sim", components)


def _examples(minor: int) -> list[dict[str, Any]]:
    docs = list(render("examples"))
    if minor >= 36:
        docs += render("examples/k8s-1.36")
    return docs


@pytest.fixture
async def installed(control_plane: RealControlPlane, admin: KubeClient) -> AsyncIterator[Applier]:
    """The sim overlay, created object by object with strict validation, removed afterwards."""
    applier = Applier(admin)
    docs = sorted(
        _overlay(control_plane.release.minor_number), key=lambda d: d["kind"] != "Namespace"
    )
    try:
        for doc in docs:
            await applier.create(doc)
        yield applier
    finally:
        await applier.delete_all()


async def test_the_overlay_and_the_examples_pass_strict_validation(
    control_plane: RealControlPlane, installed: Applier
):
    kinds = {doc["kind"] for _, doc in installed.created}
    assert {"ClusterRole", "DaemonSet", "DeviceClass", "ValidatingAdmissionPolicy"} <= kinds
    examples = sorted(
        _examples(control_plane.release.minor_number), key=lambda d: d["kind"] != "Namespace"
    )
    await wait_for_service_account(installed.client, "default")
    made = len(installed.created)
    for doc in examples:
        await installed.create(doc)
    namespaces = sum(doc["kind"] == "Namespace" for doc in examples)
    assert len(installed.created) - made == len(examples) - namespaces


async def test_the_discovery_agent_with_its_own_token_writes_only_its_nodes_slices(
    control_plane: RealControlPlane,
    admin: KubeClient,
    installed: Applier,
    nats_settings: NATSSettings,
    tmp_path: Path,
):
    node, other = f"install-{next(_nodes)}", f"install-{next(_nodes)}"
    for name in (node, other):
        await register_node(admin, name)
    token = await pod_bound_token(admin, namespace=NAMESPACE, account="dra-discovery", node=node)
    kubeconfig = control_plane.write_token_kubeconfig(tmp_path / "discovery.kubeconfig", token)
    settings = KubeSettings(kubeconfig=str(kubeconfig))
    config = DiscoveryConfig(node_name=node, nats=nats_settings, kube=settings)
    async with running(DiscoveryAgent(config, backend=sim.SimBackend.from_profile("gpu"))):
        listed = await admin.list(RESOURCE_SLICES, field_selector=f"spec.nodeName={node}")
        assert listed["items"], "published through the rendered ClusterRole"
    as_agent = await KubeClient.connect(settings)
    try:
        forged = dict(listed["items"][0])
        forged["metadata"] = {"name": f"forged-{other}"}
        forged["spec"] = {**forged["spec"], "nodeName": other, "pool": {
            "name": other, "generation": 1, "resourceSliceCount": 1}}  # fmt: skip
        refusal = await _refused_once_in_force(as_agent, admin, forged)
        assert f"may not write ResourceSlices of node {other}" in refusal
    finally:
        await as_agent.close()
    for item in (await admin.list(RESOURCE_SLICES, field_selector=f"spec.nodeName={node}"))[
        "items"
    ]:
        await admin.delete(RESOURCE_SLICES, item["metadata"]["name"])


async def _refused_once_in_force(agent: KubeClient, admin: KubeClient, forged: Obj) -> str:
    """The refusal of `forged`. A policy is enforced once the API server's informer has seen
    it and its binding (about a second after they are created); a write let through before
    that is removed and tried again."""
    for _ in range(100):
        try:
            await agent.create(RESOURCE_SLICES, forged)
        except KubeError as exc:
            return str(exc)
        await admin.delete(RESOURCE_SLICES, forged["metadata"]["name"])
        await asyncio.sleep(0.1)
    raise AssertionError("the ResourceSlice policy never refused another node's slice")


# --- the callout Secret and the certify key, as the docs make them ---------------------------


def _doc_commands(page: str, *needles: str) -> list[str]:
    """The shell commands of `page`'s sh blocks (continuation lines joined, comments
    dropped) that contain every needle."""
    text = (REPO / "docs" / page).read_text()
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.DOTALL):
        joined = re.sub(r"\\\n\s*", "", block)
        for line in joined.splitlines():
            line = line.strip()
            if line and not line.startswith("#") and all(n in line for n in needles):
                commands.append(line)
    return commands


def _run_documented(control_plane: RealControlPlane, command: str) -> str:
    """A documented command as an admin runs it (kubectl on the cluster, dra-nats-auth on
    PATH); its output. The control plane runs in processes of its own: blocking is fine."""
    env = {
        **os.environ,
        "KUBECONFIG": str(control_plane.admin_kubeconfig),
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }
    result = subprocess.run(
        ["bash", "-o", "pipefail", "-c", command],
        capture_output=True, text=True, timeout=60, env=env, check=False,
    )  # fmt: skip
    assert result.returncode == 0, f"{command}\n{result.stderr}"
    return result.stdout


async def _data(admin: KubeClient, rt: ResourceType, name: str) -> dict[str, str]:
    obj = await admin.get(rt, name, namespace=NAMESPACE)
    if rt is SECRETS:
        return {k: base64.b64decode(v).decode() for k, v in obj["data"].items()}
    return dict(obj["data"])


@pytest.fixture
async def bus_keys(admin: KubeClient, installed: Applier) -> AsyncIterator[None]:
    """Removes the callout Secret and the certify key's ConfigMap the test makes."""
    yield
    for rt, name in ((SECRETS, CALLOUT_SECRET), (CONFIG_MAPS, AUTH_KEY_CONFIGMAP)):
        with contextlib.suppress(KubeError):
            await admin.delete(rt, name, namespace=NAMESPACE)


async def _assert_pods_sign_and_enforce_with(admin: KubeClient, tmp_path: Path) -> None:
    """Every item of the two objects the rendered pods mount exists, and the auth service and
    every agent, given those files, build their configs: enforce, with matching keys."""
    callout = await _data(admin, SECRETS, CALLOUT_SECRET)
    auth_key = await _data(admin, CONFIG_MAPS, AUTH_KEY_CONFIGMAP)
    objects = {CALLOUT_SECRET: callout, AUTH_KEY_CONFIGMAP: auth_key}
    overlay = render("overlays/sim")
    (auth,) = [d for d in _of_kind(overlay, "Deployment") if d["metadata"]["name"] == AUTH]
    workloads = [auth, *_of_kind(overlay, "DaemonSet")]
    for workload in workloads:
        pod, container = workload["spec"]["template"]["spec"], _container(workload)
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        files: dict[str, str] = {}
        for mount in container.get("volumeMounts", []):
            source = volumes[mount["name"]].get("secret") or volumes[mount["name"]].get("configMap")
            name = (source or {}).get("secretName") or (source or {}).get("name")
            if name not in objects:
                continue
            for item in source["items"]:
                assert item["key"] in objects[name], f"{workload['metadata']['name']}: {item}"
                local = tmp_path / workload["metadata"]["name"] / item["path"]
                local.parent.mkdir(parents=True, exist_ok=True)
                local.write_text(objects[name][item["key"]])
                files[f"{mount['mountPath']}/{item['path']}"] = str(local)
        # The TLS Secret's CA and the projected token: stand-ins.
        env = local_env({k: files.get(v, v) for k, v in _resolved_env(workload).items()})
        if workload is auth:
            certify = auth_cli.parse([], env).certify_key()
            assert certify is not None
            assert certify.public == auth_key["certify.pub"]
        else:
            nats = CONFIG_BUILDERS[container["name"]]([], env).nats
            assert nats.bus_signatures == signature_settings.ENFORCE, workload["metadata"]["name"]
            assert nats.auth_key() == signature_settings.decode_auth_key(auth_key["certify.pub"])


async def test_the_documented_install_commands_make_what_the_pods_mount(
    control_plane: RealControlPlane,
    admin: KubeClient,
    bus_keys: None,
    tmp_path: Path,
):
    (keygen,) = _doc_commands("install.md", "dra-nats-auth keygen", "kubectl apply")
    (configmap,) = _doc_commands("install.md", f"create configmap {AUTH_KEY_CONFIGMAP}")
    for command in (keygen, configmap):
        _run_documented(control_plane, command)
    await _assert_pods_sign_and_enforce_with(admin, tmp_path)


async def test_the_documented_upgrade_adds_the_certify_key_and_keeps_the_others(
    control_plane: RealControlPlane,
    admin: KubeClient,
    bus_keys: None,
    tmp_path: Path,
):
    # The Secret as an earlier release's keygen made it: no certify key.
    older = {k: v for k, v in natsauth_secrets.material().items() if not k.startswith("certify.")}
    secret = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "stringData": older,
              "metadata": {"name": CALLOUT_SECRET, "namespace": NAMESPACE}}  # fmt: skip
    await admin.create(SECRETS, secret, namespace=NAMESPACE)
    commands = _doc_commands("operations.md", CALLOUT_SECRET)
    (patch,) = [c for c in commands if "kubectl -n dra-suite patch secret" in c]
    (configmap,) = [c for c in commands if f"create configmap {AUTH_KEY_CONFIGMAP}" in c]
    for command in (patch, configmap):
        _run_documented(control_plane, command)
    callout = await _data(admin, SECRETS, CALLOUT_SECRET)
    assert {k: callout[k] for k in older} == older, "the other keys are left as they were"
    await _assert_pods_sign_and_enforce_with(admin, tmp_path)
    # Then the auth service first: the documented apply picks its objects and no other.
    (first,) = _doc_commands("operations.md", "kubectl apply -k", " -l ")
    first = first.replace("<your kustomization>", str(KUSTOMIZE / "overlays" / "sim"))
    picked = set(_run_documented(control_plane, f"{first} --dry-run=server -o name").split())
    assert "deployment.apps/dra-nats-auth" in picked
    assert not [n for n in picked if n.startswith(("daemonset", "statefulset"))], picked
