"""ServiceAccount TokenRequest and TokenReview of the API emulator, as kube-apiserver answers
them, through kubernetes-asyncio and raw HTTP."""

from __future__ import annotations

import time
from typing import Any

import aiohttp
import jwt
import pytest
from kubernetes_asyncio import client

from devcluster.apiserver import APIServerEmulator

NS = "dra-suite"
AUDIENCE = "nats.dra-suite.io"
EXTRA = "authentication.kubernetes.io/"


@pytest.fixture
def cluster(apiserver: APIServerEmulator) -> APIServerEmulator:
    apiserver.create_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    apiserver.create_object(
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "agent", "namespace": NS},
        }
    )
    apiserver.create_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}})
    apiserver.create_object({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "agent-a", "namespace": NS},
        "spec": {"nodeName": "node-a", "serviceAccountName": "agent",
                 "containers": [{"name": "c", "image": "i"}]},
    })  # fmt: skip
    return apiserver


def pod_ref(cluster: APIServerEmulator, name: str = "agent-a") -> dict[str, Any]:
    pod = cluster.get_object("pods", name, NS)
    assert pod is not None
    return {"kind": "Pod", "apiVersion": "v1", "name": name, "uid": pod["metadata"]["uid"]}


async def request_token(
    http: aiohttp.ClientSession, spec: dict[str, Any], *, account: str = "agent"
) -> tuple[int, dict[str, Any]]:
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
    async with http.post(
        f"/api/v1/namespaces/{NS}/serviceaccounts/{account}/token", json=body
    ) as r:
        return r.status, await r.json()


async def review(
    http: aiohttp.ClientSession, token: str, audiences: list[str] | None = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {"token": token}
    if audiences is not None:
        spec["audiences"] = audiences
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec}
    async with http.post("/apis/authentication.k8s.io/v1/tokenreviews", json=body) as answer:
        assert answer.status == 201
        status: dict[str, Any] = (await answer.json())["status"]
        return status


async def test_a_pod_bound_token_has_kubes_claim_layout(cluster, http):
    status, answer = await request_token(
        http,
        {"audiences": [AUDIENCE], "expirationSeconds": 3600, "boundObjectRef": pod_ref(cluster)},
    )
    assert status == 201
    token = answer["status"]["token"]
    claims = jwt.decode(token, options={"verify_signature": False})
    assert claims["aud"] == [AUDIENCE]
    assert claims["sub"] == f"system:serviceaccount:{NS}:agent"
    assert claims["exp"] - claims["iat"] == 3600
    assert claims["nbf"] == claims["iat"]
    assert claims["iss"].startswith("https://kubernetes.default.svc")
    kube = claims["kubernetes.io"]
    assert kube["namespace"] == NS
    assert kube["serviceaccount"]["name"] == "agent"
    assert kube["pod"]["name"] == "agent-a"
    assert kube["node"]["name"] == "node-a"
    assert answer["status"]["expirationTimestamp"].endswith("Z")


async def test_a_review_names_the_user_node_and_pod(cluster, http):
    _, answer = await request_token(
        http, {"audiences": [AUDIENCE], "boundObjectRef": pod_ref(cluster)}
    )
    status = await review(http, answer["status"]["token"], [AUDIENCE])
    assert status["authenticated"] is True
    assert status["audiences"] == [AUDIENCE]
    user = status["user"]
    assert user["username"] == f"system:serviceaccount:{NS}:agent"
    assert f"system:serviceaccounts:{NS}" in user["groups"]
    extra = user["extra"]
    assert extra[f"{EXTRA}node-name"] == ["node-a"]
    assert extra[f"{EXTRA}pod-name"] == ["agent-a"]
    assert extra[f"{EXTRA}pod-uid"] == [pod_ref(cluster)["uid"]]
    assert extra[f"{EXTRA}node-uid"][0]
    assert extra[f"{EXTRA}credential-id"][0].startswith("JTI=")


async def test_a_node_bound_token_names_the_node(cluster, http):
    ref = {"kind": "Node", "apiVersion": "v1", "name": "node-a"}
    _, answer = await request_token(http, {"audiences": [AUDIENCE], "boundObjectRef": ref})
    status = await review(http, answer["status"]["token"], [AUDIENCE])
    assert status["user"]["extra"][f"{EXTRA}node-name"] == ["node-a"]
    assert f"{EXTRA}pod-name" not in status["user"]["extra"]


async def test_the_review_goes_through_kubernetes_asyncio(cluster, kube):
    api = client.CoreV1Api(kube)
    body = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[AUDIENCE], expiration_seconds=3600)
    )
    minted = await api.create_namespaced_service_account_token("agent", NS, body)
    reviewed = await client.AuthenticationV1Api(kube).create_token_review(
        client.V1TokenReview(spec=client.V1TokenReviewSpec(token=minted.status.token,
                                                           audiences=[AUDIENCE]))
    )  # fmt: skip
    assert reviewed.status.authenticated
    assert reviewed.status.user.username == f"system:serviceaccount:{NS}:agent"


async def _expired(cluster, http) -> str:
    cluster.cluster.tokens.clock = lambda: time.time() - 7200
    _, answer = await request_token(http, {"audiences": [AUDIENCE]})
    cluster.cluster.tokens.clock = time.time
    return str(answer["status"]["token"])


async def test_review_refusals(cluster, http):
    _, answer = await request_token(
        http, {"audiences": [AUDIENCE], "boundObjectRef": pod_ref(cluster)}
    )
    token = answer["status"]["token"]
    wrong_audience = await review(http, token, ["https://kubernetes.default.svc.cluster.local"])
    assert wrong_audience["authenticated"] is False
    assert "audiences" in wrong_audience["error"]
    expired = await review(http, await _expired(cluster, http), [AUDIENCE])
    assert (expired["authenticated"], "expired" in expired["error"]) == (False, True)
    forged = jwt.encode(jwt.decode(token, options={"verify_signature": False}), "x" * 32)
    assert (await review(http, forged, [AUDIENCE]))["authenticated"] is False
    assert (await review(http, "garbage", [AUDIENCE]))["authenticated"] is False
    cluster.delete_object("pods", "agent-a", NS)
    gone = await review(http, token, [AUDIENCE])
    assert (gone["authenticated"], "deleted" in gone["error"]) == (False, True)


async def test_token_request_refusals(cluster, http):
    status, answer = await request_token(http, {"audiences": [AUDIENCE]}, account="nobody")
    assert (status, answer["reason"]) == (404, "NotFound")
    status, answer = await request_token(http, {"expirationSeconds": 60})
    assert (status, answer["reason"]) == (422, "Invalid")
    ref = {**pod_ref(cluster), "uid": "0000"}
    status, answer = await request_token(http, {"boundObjectRef": ref})
    assert status == 409
    status, answer = await request_token(http, {"boundObjectRef": {"kind": "Secret", "name": "s"}})
    assert (status, answer["reason"]) == (422, "Invalid")
    status, answer = await request_token(http, {"expirationSeconds": "soon"})
    assert (status, answer["reason"]) == (422, "Invalid")


async def test_a_deleted_service_account_invalidates_its_tokens(cluster, http):
    _, answer = await request_token(http, {"audiences": [AUDIENCE]})
    cluster.delete_object("serviceaccounts", "agent", NS)
    status = await review(http, answer["status"]["token"], [AUDIENCE])
    assert status["authenticated"] is False


async def test_tokens_verify_locally_against_the_published_key_set(cluster, http):
    async with http.get("/.well-known/openid-configuration") as answer:
        assert answer.status == 200
        discovery = await answer.json()
    assert discovery["issuer"] == "https://kubernetes.default.svc.cluster.local"
    assert discovery["jwks_uri"] == f"{cluster.url}/openid/v1/jwks"
    assert discovery["id_token_signing_alg_values_supported"] == ["RS256"]
    headers = {"Accept": "application/jwk-set+json"}
    async with http.get("/openid/v1/jwks", headers=headers) as answer:
        assert answer.headers["Content-Type"].startswith("application/jwk-set+json")
        (key,) = (await answer.json(content_type=None))["keys"]
    assert (key["kty"], key["alg"], key["use"]) == ("RSA", "RS256", "sig")
    _, issued = await request_token(
        http, {"audiences": [AUDIENCE], "boundObjectRef": pod_ref(cluster)}
    )
    token = issued["status"]["token"]
    assert jwt.get_unverified_header(token)["kid"] == key["kid"]
    claims = jwt.decode(
        token, jwt.PyJWK(key).key, algorithms=["RS256"], audience=AUDIENCE,
        issuer=discovery["issuer"],
    )  # fmt: skip
    assert claims["kubernetes.io"]["node"]["name"] == "node-a"


async def test_the_key_set_is_served_only_as_a_jwk_set(cluster, http):
    async with http.get("/openid/v1/jwks", headers={"Accept": "application/json"}) as answer:
        assert answer.status == 406
        assert "application/jwk-set+json" in await answer.text()
