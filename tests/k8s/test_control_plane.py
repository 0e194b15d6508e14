"""The real control plane: built versions, OIDC and tokens bound to nodes, and a pod with a
ResourceClaim scheduled by kube-scheduler onto a Node from slices our discovery agent published.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

import aiohttp
import jwt
import pytest

from devcluster.controlplane import RealControlPlane, register_node
from devcluster.controlplane.nodes import wait_for_service_account
from services.discovery.agent import DiscoveryAgent
from services.discovery.config import DiscoveryConfig
from shared.config import NATSSettings
from shared.kube.client import KubeClient
from shared.kube.resources import (
    DEVICE_CLASSES,
    PODS,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    ResourceType,
)
from shared.vendors.sim import discovery as sim
from tests.integration.discovery.agent_runner import running

pytestmark = pytest.mark.k8s

DRIVER = "sim.dra-suite.io"
NAMESPACES = ResourceType("", "v1", "namespaces", "Namespace", namespaced=False)
SERVICE_ACCOUNTS = ResourceType("", "v1", "serviceaccounts", "ServiceAccount", namespaced=True)
TEMPLATES = ResourceType(
    "resource.k8s.io", "v1", "resourceclaimtemplates", "ResourceClaimTemplate", True
)
_names = itertools.count(1)


@pytest.fixture
async def namespace(admin: KubeClient) -> str:
    name = f"test-{next(_names)}"
    await admin.create(
        NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    )
    await wait_for_service_account(admin, name)
    return name


@pytest.fixture
async def node(admin: KubeClient) -> str:
    name = f"node-{next(_names)}"
    await register_node(admin, name)
    return name


async def test_every_server_reports_its_stamped_version(
    control_plane: RealControlPlane, admin: KubeClient
):
    expected = control_plane.release.version
    version = await admin.get_path("/version")
    assert version["gitVersion"] == expected
    assert (version["major"], version["minor"]) == ("1", str(control_plane.release.minor_number))
    for component in ("kube-scheduler", "kube-controller-manager"):
        binary = control_plane.binaries.path(component)
        printed = await asyncio.create_subprocess_exec(
            binary, "--version", stdout=asyncio.subprocess.PIPE
        )
        out, _ = await printed.communicate()
        assert out.decode().split() == ["Kubernetes", expected]


async def test_service_account_tokens_are_asymmetric_with_oidc_discovery(
    control_plane: RealControlPlane, admin: KubeClient
):
    discovery = await admin.get_path("/.well-known/openid-configuration")
    assert discovery["issuer"] == control_plane.issuer
    assert discovery["jwks_uri"].endswith("/openid/v1/jwks")
    assert discovery["id_token_signing_alg_values_supported"] == ["RS256"]
    keys = (await _jwks(control_plane))["keys"]
    assert [(k["kty"], k["alg"], k["use"]) for k in keys] == [("RSA", "RS256", "sig")]


async def test_a_token_bound_to_a_pod_names_the_pods_node(
    control_plane: RealControlPlane, admin: KubeClient, namespace: str, node: str
):
    await admin.create(SERVICE_ACCOUNTS, {"metadata": {"name": "agent"}}, namespace=namespace)
    pod = await admin.create(PODS, _pod("agent-0", node=node, account="agent"), namespace=namespace)
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {
            "audiences": ["dra-suite-nats"],
            "expirationSeconds": 600,
            "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "agent-0",
                               "uid": pod["metadata"]["uid"]},
        },
    }  # fmt: skip
    issued = await admin._request(
        "POST",
        SERVICE_ACCOUNTS.path(namespace=namespace, name="agent", subresource="token"),
        what="token request",
        body=request,
    )
    token = issued["status"]["token"]
    (key,) = (await _jwks(control_plane))["keys"]
    claims = jwt.decode(
        token, jwt.PyJWK(key).key, algorithms=["RS256"], audience="dra-suite-nats",
        issuer=control_plane.issuer,
    )  # fmt: skip
    assert claims["kubernetes.io"]["node"]["name"] == node
    assert claims["kubernetes.io"]["pod"]["name"] == "agent-0"
    review = await admin._request(
        "POST",
        "/apis/authentication.k8s.io/v1/tokenreviews",
        what="token review",
        body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
              "spec": {"token": token, "audiences": ["dra-suite-nats"]}},
    )  # fmt: skip
    status = review["status"]
    assert status["authenticated"] is True
    assert status["user"]["username"] == f"system:serviceaccount:{namespace}:agent"
    assert status["user"]["extra"]["authentication.kubernetes.io/node-name"] == [node]


async def test_the_scheduler_allocates_a_claim_from_slices_our_agent_published(
    control_plane: RealControlPlane,
    admin: KubeClient,
    namespace: str,
    node: str,
    nats_settings: NATSSettings,
):
    config = DiscoveryConfig(node_name=node, nats=nats_settings, kube=control_plane.kube_settings())
    async with running(DiscoveryAgent(config, backend=sim.SimBackend.from_profile("gpu"))):
        published = await _pool_slices(admin, node)
        assert published, "the real API server holds our slices"
        await _ensure_device_class(admin)
        claim = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "two-gpus"},
            "spec": {"devices": {"requests": [
                {"name": "gpus", "exactly": {"deviceClassName": DRIVER, "count": 2}},
            ]}},
        }  # fmt: skip
        await admin.create(RESOURCE_CLAIMS, claim, namespace=namespace)
        pod = _pod("worker", claims=[{"name": "gpus", "resourceClaimName": "two-gpus"}])
        await admin.create(PODS, pod, namespace=namespace)
        scheduled = await _until(lambda: _scheduled(admin, namespace, "worker"))
        assert scheduled["spec"]["nodeName"] == node
        allocated = await admin.get(RESOURCE_CLAIMS, "two-gpus", namespace=namespace)
    results = allocated["status"]["allocation"]["devices"]["results"]
    names = {d["name"] for s in published for d in s["spec"].get("devices", [])}
    assert len(results) == 2
    assert all((r["driver"], r["pool"]) == (DRIVER, node) for r in results)
    assert {r["device"] for r in results} <= names
    assert [r["name"] for r in allocated["status"]["reservedFor"]] == ["worker"]


async def test_a_claim_from_a_template_is_made_by_the_controller_manager(
    control_plane: RealControlPlane,
    admin: KubeClient,
    namespace: str,
    node: str,
    nats_settings: NATSSettings,
):
    config = DiscoveryConfig(node_name=node, nats=nats_settings, kube=control_plane.kube_settings())
    async with running(DiscoveryAgent(config, backend=sim.SimBackend.from_profile("gpu"))):
        await _pool_slices(admin, node)
        await _ensure_device_class(admin)
        template = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "one-gpu"},
            "spec": {"spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": DRIVER}},
            ]}}},
        }  # fmt: skip
        await admin.create(TEMPLATES, template, namespace=namespace)
        pod = _pod("trainer", claims=[{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}])
        await admin.create(PODS, pod, namespace=namespace)
        scheduled = await _until(lambda: _scheduled(admin, namespace, "trainer"))
    (status,) = scheduled["status"]["resourceClaimStatuses"]
    made = await admin.get(RESOURCE_CLAIMS, status["resourceClaimName"], namespace=namespace)
    assert made["metadata"]["ownerReferences"][0]["name"] == "trainer"
    assert made["metadata"]["annotations"]["resource.kubernetes.io/pod-claim-name"] == "gpu"
    (result,) = made["status"]["allocation"]["devices"]["results"]
    assert (result["driver"], result["pool"]) == (DRIVER, node)


async def _jwks(control_plane: RealControlPlane) -> dict[str, Any]:
    """The JWKS; kube-apiserver serves it only as `application/jwk-set+json`."""
    headers = {"Accept": "application/jwk-set+json"}
    async with aiohttp.ClientSession() as session:
        url = f"{control_plane.url}/openid/v1/jwks"
        context = control_plane.admin_ssl_context()
        async with session.get(url, ssl=context, headers=headers) as response:
            assert response.status == 200, await response.text()
            loaded: dict[str, Any] = json.loads(await response.text())
            return loaded


def _pod(
    name: str,
    *,
    node: str = "",
    account: str = "",
    claims: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "registry.k8s.io/pause:3.10"}
    spec: dict[str, Any] = {"containers": [container]}
    if node:
        spec["nodeName"] = node
    if account:
        spec["serviceAccountName"] = account
    if claims:
        spec["resourceClaims"] = claims
        container["resources"] = {"claims": [{"name": c["name"]} for c in claims]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


async def _ensure_device_class(admin: KubeClient) -> None:
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": DRIVER},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
    }
    try:
        await admin.create(DEVICE_CLASSES, body)
    except Exception as exc:  # a test before this one made it
        if "already exists" not in str(exc):
            raise


async def _pool_slices(admin: KubeClient, node: str) -> list[dict[str, Any]]:
    async def found() -> list[dict[str, Any]] | None:
        listed = await admin.list(RESOURCE_SLICES, field_selector=f"spec.nodeName={node}")
        return listed["items"] or None

    slices: list[dict[str, Any]] = await _until(found)
    return slices


async def _scheduled(admin: KubeClient, namespace: str, name: str) -> dict[str, Any] | None:
    pod = await admin.get(PODS, name, namespace=namespace)
    return pod if pod["spec"].get("nodeName") else None


async def _until(check: Any, *, timeout_s: float = 30.0) -> Any:
    async with asyncio.timeout(timeout_s):
        while True:
            result = await check()
            if result:
                return result
            await asyncio.sleep(0.2)
