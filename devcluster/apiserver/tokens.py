"""ServiceAccount tokens as kube-apiserver issues and reviews them: TokenRequest, TokenReview.

`POST /api/v1/namespaces/{ns}/serviceaccounts/{name}/token` mints a JWT with kube's claim
layout (`aud`, `exp`, `iat`, `nbf`, `iss`, `sub`, `jti`, `kubernetes.io` with namespace,
serviceaccount, pod and node), bound to a Pod (its node from `spec.nodeName`) or a Node.
`POST /apis/authentication.k8s.io/v1/tokenreviews` answers like kube: the user, groups and
`extra` (node-name/uid, pod-name/uid, credential-id), the audiences that matched, or
`authenticated: false` with an error (bad signature, expired, wrong audience, deleted
ServiceAccount or Pod). Tokens are RS256 with the cluster's own RSA key, and the key is
published as kube-apiserver publishes it: OIDC discovery at `/.well-known/openid-configuration`
and the key set at `/openid/v1/jwks` (served only as `application/jwk-set+json`; another
`Accept` is answered 406, as kube does), so a local signature check works against both.
Bodies are checked against the published schemas like every other write.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import jwt
from aiohttp import web

from devcluster.apiserver import errors
from devcluster.apiserver.handlers import CLUSTER, json_response
from devcluster.apiserver.schema import schema_set
from devcluster.apiserver.store import Store
from devcluster.apiserver.tokensigner import ALGORITHM, ISSUER, TokenIssuer

__all__ = ["routes"]

_EXTRA = "authentication.kubernetes.io/"
_REQUEST_KIND = ("authentication.k8s.io/v1", "TokenRequest")
_REVIEW_KIND = ("authentication.k8s.io/v1", "TokenReview")


def _timestamp(unix_s: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(unix_s))


async def _body(request: web.Request, kind: tuple[str, str]) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError as exc:
        raise errors.bad_request(f"error decoding request body: {exc}") from exc
    if not isinstance(body, dict):
        raise errors.bad_request("the body of the request must be a JSON object")
    body.setdefault("apiVersion", kind[0])
    body.setdefault("kind", kind[1])
    if (body["apiVersion"], body["kind"]) != kind:
        raise errors.bad_request(f"the body must be a {kind[1]} of {kind[0]}")
    cluster = request.app[CLUSTER]
    found = schema_set(cluster.config.kubernetes_version).validate(body)
    if found:
        raise errors.invalid(kind[1], "authentication.k8s.io", "", found)
    return body


def _object(store: Store, storage: str, namespace: str, name: str, plural: str) -> dict[str, Any]:
    obj = store.get(storage, namespace, name)
    if obj is None:
        raise errors.not_found(plural, "", name)
    return obj


def _binding(store: Store, namespace: str, ref: dict[str, Any]) -> dict[str, Any]:
    """The `kubernetes.io` claims of the bound object (Pod with its node, or Node)."""
    kind, name = ref.get("kind"), str(ref.get("name") or "")
    if kind == "Pod":
        pod = _object(store, "pods", namespace, name, "pods")
        uid = pod["metadata"]["uid"]
        if ref.get("uid") and ref["uid"] != uid:
            raise errors.conflict("pods", "", name, f"the UID in the bound object reference "
                                  f"({ref['uid']}) does not match the UID in record")  # fmt: skip
        claims: dict[str, Any] = {"pod": {"name": name, "uid": uid}}
        node = str((pod.get("spec") or {}).get("nodeName") or "")
        if node:
            node_obj = store.get("nodes", "", node)
            claims["node"] = {"name": node, "uid": node_obj["metadata"]["uid"] if node_obj else ""}
        return claims
    if kind == "Node":
        node_obj = _object(store, "nodes", "", name, "nodes")
        return {"node": {"name": name, "uid": node_obj["metadata"]["uid"]}}
    cause = errors.FieldError.not_supported("spec.boundObjectRef.kind", kind, ["Pod", "Node"])
    raise errors.invalid("TokenRequest", "authentication.k8s.io", "", [cause])


async def _token_request(request: web.Request) -> web.Response:
    cluster = request.app[CLUSTER]
    namespace, name = request.match_info["namespace"], request.match_info["name"]
    body = await _body(request, _REQUEST_KIND)
    account = _object(cluster.store, "serviceaccounts", namespace, name, "serviceaccounts")
    spec = body.setdefault("spec", {})
    issuer: TokenIssuer = cluster.tokens
    expiration = int(spec.get("expirationSeconds") or 3600)
    if expiration < issuer.min_expiration_s:
        cause = errors.FieldError.invalid(
            "spec.expirationSeconds", expiration, "may not specify a duration less than 10 minutes"
        )
        raise errors.invalid("TokenRequest", "authentication.k8s.io", name, [cause])
    audiences = list(spec.get("audiences") or [ISSUER])
    kube: dict[str, Any] = {
        "namespace": namespace,
        "serviceaccount": {"name": name, "uid": account["metadata"]["uid"]},
    }
    if spec.get("boundObjectRef"):
        kube |= _binding(cluster.store, namespace, spec["boundObjectRef"])
    claims = {
        "aud": audiences, "sub": f"system:serviceaccount:{namespace}:{name}",
        "jti": str(uuid.uuid4()), "kubernetes.io": kube,
    }  # fmt: skip
    token, exp = issuer.issue(claims, expiration_s=expiration)
    spec.update(audiences=audiences, expirationSeconds=expiration)
    body["metadata"] = {"name": name, "namespace": namespace}
    body["status"] = {"token": token, "expirationTimestamp": _timestamp(exp)}
    return json_response(body, status=201)


def _review(cluster: Any, token: str, audiences: list[str]) -> dict[str, Any]:
    try:
        claims = cluster.tokens.verify(token)
    except jwt.ExpiredSignatureError:
        return {"authenticated": False, "error": "[invalid bearer token, token has expired]"}
    except jwt.InvalidTokenError:
        return {"authenticated": False, "error": "[invalid bearer token, square/go-jose: error "
                "in cryptographic primitive]"}  # fmt: skip
    token_audiences = list(claims.get("aud") or [])
    wanted = audiences or [ISSUER]
    matched = [aud for aud in wanted if aud in token_audiences]
    if not matched:
        return {"authenticated": False, "error": "[invalid bearer token, token audiences "
                f"{token_audiences} is invalid for the target audiences {wanted}]"}  # fmt: skip
    kube = claims.get("kubernetes.io") or {}
    namespace, account = kube.get("namespace", ""), kube.get("serviceaccount") or {}
    found = cluster.store.get("serviceaccounts", namespace, account.get("name", ""))
    if found is None or found["metadata"]["uid"] != account.get("uid"):
        return {"authenticated": False, "error": "[invalid bearer token, service account "
                f"{namespace}/{account.get('name')} has been deleted]"}  # fmt: skip
    extra = {f"{_EXTRA}credential-id": [f"JTI={claims.get('jti', '')}"]}
    if pod := kube.get("pod"):
        current = cluster.store.get("pods", namespace, pod["name"])
        if current is None or current["metadata"]["uid"] != pod["uid"]:
            return {"authenticated": False, "error": "[invalid bearer token, pod "
                    f"{namespace}/{pod['name']} has been deleted]"}  # fmt: skip
        extra |= {f"{_EXTRA}pod-name": [pod["name"]], f"{_EXTRA}pod-uid": [pod["uid"]]}
    if node := kube.get("node"):
        extra |= {f"{_EXTRA}node-name": [node["name"]], f"{_EXTRA}node-uid": [node["uid"]]}
    user = {
        "username": claims["sub"], "uid": account.get("uid", ""),
        "groups": ["system:serviceaccounts", f"system:serviceaccounts:{namespace}",
                   "system:authenticated"],
        "extra": extra,
    }  # fmt: skip
    return {"authenticated": True, "user": user, "audiences": matched}


async def _token_review(request: web.Request) -> web.Response:
    cluster = request.app[CLUSTER]
    body = await _body(request, _REVIEW_KIND)
    spec = body.get("spec") or {}
    token = str(spec.get("token") or "")
    body["metadata"] = {"creationTimestamp": None}
    body["status"] = _review(cluster, token, list(spec.get("audiences") or []))
    return json_response(body, status=201)


_JWKS_TYPE = "application/jwk-set+json"
JWKS_PATH = "/openid/v1/jwks"
DISCOVERY_PATH = "/.well-known/openid-configuration"


async def _openid_configuration(request: web.Request) -> web.Response:
    document = {
        "issuer": ISSUER,
        "jwks_uri": f"{request.scheme}://{request.host}{JWKS_PATH}",
        "response_types_supported": ["id_token"],
        "subject_types_supported": ["public"],
        "id_token_signing_alg_values_supported": [ALGORITHM],
    }
    return json_response(document, status=200)


async def _jwks(request: web.Request) -> web.Response:
    accept = request.headers.get("Accept", "*/*")
    wanted = {part.split(";")[0].strip() for part in accept.split(",")}
    if not wanted & {_JWKS_TYPE, "*/*", "application/*"}:
        text = f"406: Not Acceptable\n\nAvailable representations: {_JWKS_TYPE}"
        return web.Response(status=406, text=text)
    issuer: TokenIssuer = request.app[CLUSTER].tokens
    return web.json_response(issuer.jwks(), content_type=_JWKS_TYPE)


def routes() -> list[web.RouteDef]:
    return [
        web.get(DISCOVERY_PATH, _openid_configuration),
        web.get(JWKS_PATH, _jwks),
        web.post("/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token", _token_request),
        web.post("/apis/authentication.k8s.io/v1/tokenreviews", _token_review),
    ]
