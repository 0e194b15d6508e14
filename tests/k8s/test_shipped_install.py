"""The shipped install on the real API server: the rendered sim overlay (RBAC, admission
policies, DeviceClasses, DaemonSets) and the examples pass strict server-side validation, and
the discovery agent, holding only its own ServiceAccount's token bound to a pod on its node,
publishes slices through its rendered ClusterRole while the node-scoped admission policy
refuses it another node's slices, with the user info the real API server gives it."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from services.devcluster.controlplane import RealControlPlane, register_node
from services.devcluster.controlplane.nodes import wait_for_service_account
from services.discovery.agent import DiscoveryAgent
from services.discovery.backends import sim
from services.discovery.config import DiscoveryConfig
from shared.config import KubeSettings, NATSSettings
from shared.errors import KubeError
from shared.kube.client import KubeClient
from shared.kube.resources import RESOURCE_SLICES, ResourceType
from tests.integration.discovery.agent_runner import running
from tests.k8s.apply import Applier
from tests.k8s.tokens import pod_bound_token
from tests.unit.deploy.manifests import KUBECTL, render

pytestmark = [
    pytest.mark.k8s,
    pytest.mark.skipif(KUBECTL is None, reason="kubectl renders the overlays"),
]

DRIVER = "sim.dra-suite.io"
NAMESPACE = "dra-suite"
SERVICE_ACCOUNTS = ResourceType("", "v1", "serviceaccounts", "ServiceAccount", namespaced=True)
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
