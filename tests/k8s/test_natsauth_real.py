"""The auth service's token checks against the real API server: the `dra-nats-auth`
ServiceAccount, holding only a pod-bound token and the rendered RBAC (issuer discovery and
`system:auth-delegator`), reads OIDC discovery and the JWKS, checks real agent tokens locally
and asks TokenReview about them; tokens that are junk, foreign, for another audience, not
bound to a pod or of no agent are refused locally and never reach the API server."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from devcluster.controlplane import RealControlPlane, register_node
from devcluster.controlplane.nodes import wait_for_service_account
from services.natsauth.apifetch import KubeFetch
from services.natsauth.identity import Identity, Policy, Refusal, identify
from services.natsauth.keyset import DISCOVERY_PATH, JWKS_TYPE, IssuerKeys
from services.natsauth.localcheck import LocalCheck, TokenClaims
from services.natsauth.tokenreview import KubeTokenReviewer
from shared.config import KubeSettings
from shared.errors import KubeError
from shared.kube.client import KubeClient
from shared.kube.resources import PODS, ResourceType
from tests.k8s.apply import Applier
from tests.unit.deploy.manifests import KUBECTL, render

pytestmark = [
    pytest.mark.k8s,
    pytest.mark.skipif(KUBECTL is None, reason="kubectl renders the overlays"),
]

NAMESPACE = "dra-suite"
AUDIENCE = "nats.dra-suite.io"
POLICY = Policy(
    agent_namespace=NAMESPACE,
    operator_users=frozenset(),
    operator_groups=frozenset({"dra-suite:operators"}),
)
SERVICE_ACCOUNTS = ResourceType("", "v1", "serviceaccounts", "ServiceAccount", namespaced=True)
RBAC_KINDS = {
    "Namespace",
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
}
_runs = itertools.count(1)


@pytest.fixture
async def rbac(admin: KubeClient) -> AsyncIterator[None]:
    """The rendered overlay's ServiceAccounts and RBAC (nothing that runs), removed afterwards."""
    applier = Applier(admin)
    docs = [d for d in render("overlays/sim") if d["kind"] in RBAC_KINDS]
    try:
        for doc in sorted(docs, key=lambda d: d["kind"] != "Namespace"):
            await applier.create(doc)
        await wait_for_service_account(admin, NAMESPACE)
        yield
    finally:
        await applier.delete_all()


async def test_agent_tokens_pass_the_local_check_and_token_review_with_the_rendered_rbac(
    control_plane: RealControlPlane, admin: KubeClient, rbac: None, tmp_path: Path
):
    node = f"auth-node-{next(_runs)}"
    await register_node(admin, node)
    auth_token = await _token(admin, "dra-nats-auth", node=node)
    kubeconfig = control_plane.write_token_kubeconfig(tmp_path / "auth.kubeconfig", auth_token)
    as_auth = await KubeClient.connect(KubeSettings(kubeconfig=str(kubeconfig)))
    try:
        fetch = KubeFetch(as_auth)
        discovery = json.loads(await fetch(DISCOVERY_PATH, accept="application/json"))
        keys = IssuerKeys(fetch)
        assert await keys.issuer() == discovery["issuer"]
        with pytest.raises(KubeError, match="HTTP 406"):  # the JWKS is served as its type only
            await fetch(discovery["jwks_uri"].removeprefix(control_plane.url), accept="text/html")
        assert json.loads(await fetch("/openid/v1/jwks", accept=JWKS_TYPE))["keys"]
        local = LocalCheck(keys, audience=AUDIENCE, policy=POLICY)
        reviewer = KubeTokenReviewer(as_auth)

        for account, role in (("dra-discovery", "discovery"), ("dra-health", "health")):
            token = await _token(admin, account, node=node, audience=AUDIENCE)
            claims = await local.check(token, now=time.time())
            user = f"system:serviceaccount:{NAMESPACE}:{account}"
            assert isinstance(claims, TokenClaims), claims
            assert (claims.username, claims.node) == (user, node)
            status = await reviewer.review(token, audience=AUDIENCE)
            assert identify(status, POLICY) == Identity(role=role, node=node, username=user)

        # What TokenReview makes of a token for the API server's own audience.
        other = await _token(admin, "dra-discovery", node=node)
        status = await reviewer.review(other, audience=AUDIENCE)
        assert status.get("authenticated") is not True
        assert isinstance(identify(status, POLICY), Refusal)
    finally:
        await as_auth.close()


async def test_tokens_that_are_no_agents_are_refused_locally(
    control_plane: RealControlPlane, admin: KubeClient, rbac: None
):
    node = f"auth-node-{next(_runs)}"
    await register_node(admin, node)
    keys = IssuerKeys(KubeFetch(admin), min_refresh_s=3600)
    local = LocalCheck(keys, audience=AUDIENCE, policy=POLICY)
    real = await _token(admin, "dra-discovery", node=node, audience=AUDIENCE)
    issuer = await keys.issuer()
    kid = jwt.get_unverified_header(real)["kid"]
    claims = jwt.decode(real, options={"verify_signature": False})
    foreign_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    refusals = {
        "junk": "not-a-token",
        "no key id": jwt.encode(claims, foreign_key, algorithm="RS256"),
        "foreign key": jwt.encode(
            claims, foreign_key, algorithm="RS256", headers={"kid": "not-the-issuers"}
        ),
        "forged with the issuer's key id": jwt.encode(
            claims, foreign_key, algorithm="RS256", headers={"kid": kid}
        ),
        "tampered": _tampered(real, sub=f"system:serviceaccount:{NAMESPACE}:dra-allocation"),
        "another audience": await _token(admin, "dra-discovery", node=node),
        "not bound to a pod": await _token(admin, "dra-discovery", audience=AUDIENCE),
        "no agent": await _token(admin, "default", node=node, audience=AUDIENCE),
    }
    reasons = {
        what: refusal.reason if isinstance(refusal := await local.check(t, now=time.time()),
                                           Refusal) else refusal
        for what, t in refusals.items()
    }  # fmt: skip
    assert reasons == {
        "junk": "token_malformed",
        "no key id": "token_signature",
        "foreign key": "token_signature",
        "forged with the issuer's key id": "token_signature",
        "tampered": "token_signature",
        "another audience": "token_audience",
        "not bound to a pod": "no_node_binding",
        "no agent": "unknown_identity",
    }
    assert claims["iss"] == issuer
    # A made-up key ID costs at most one fetch per `min_refresh_s`: here none after the first.
    assert keys.fetches == 1


def _tampered(token: str, **changes: Any) -> str:
    header, payload, signature = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    changed = json.dumps({**claims, **changes}).encode()
    return ".".join([header, base64.urlsafe_b64encode(changed).rstrip(b"=").decode(), signature])


async def _token(admin: KubeClient, account: str, *, node: str = "", audience: str = "") -> str:
    """A token of `account`; with `node`, bound to a pod there, as the kubelet projects it."""
    spec: dict[str, Any] = {"expirationSeconds": 3600}
    if audience:
        spec["audiences"] = [audience]
    if node:
        name = f"{account}-{node}-{next(_runs)}"
        pod = await admin.create(PODS, {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"nodeName": node, "serviceAccountName": account,
                     "containers": [{"name": "agent", "image": "registry.k8s.io/pause:3.10"}]},
        }, namespace=NAMESPACE)  # fmt: skip
        spec["boundObjectRef"] = {
            "kind": "Pod",
            "apiVersion": "v1",
            "name": name,
            "uid": pod["metadata"]["uid"],
        }
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
    path = SERVICE_ACCOUNTS.path(namespace=NAMESPACE, name=account, subresource="token")
    for _ in range(50):  # the ServiceAccount was just created (`default` by its controller)
        try:
            issued = await admin._request("POST", path, what="token request", body=request)
            return str(issued["status"]["token"])
        except KubeError:
            await asyncio.sleep(0.1)
    raise AssertionError(f"no token for {account}")
