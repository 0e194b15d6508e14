"""A cluster's ServiceAccount token issuer for unit tests: the emulator's signer, its OIDC
discovery and JWKS served by a fetch function (no HTTP), and tokens with kube's claims."""

from __future__ import annotations

import json
from typing import Any

from devcluster.apiserver.tokensigner import ISSUER, TokenIssuer
from services.natsauth.keyset import DISCOVERY_PATH, JWKS_TYPE
from shared.errors import KubeTransientError

__all__ = ["AUDIENCE", "Cluster"]

AUDIENCE = "nats.dra-suite.io"
_JWKS_PATH = "/openid/v1/jwks"


class Cluster:
    def __init__(self, *, now: float) -> None:
        self.signer = TokenIssuer(clock=lambda: now)
        self.now = now
        self.fetched: list[str] = []
        self.down = False

    async def fetch(self, path: str, *, accept: str) -> bytes:
        self.fetched.append(path)
        if self.down:
            raise KubeTransientError(f"get {path}: connection refused")
        if path == DISCOVERY_PATH:
            return json.dumps(
                {"issuer": ISSUER, "jwks_uri": f"https://api:6443{_JWKS_PATH}"}
            ).encode()
        assert (path, accept) == (_JWKS_PATH, JWKS_TYPE)
        return json.dumps(self.signer.jwks()).encode()

    def token(
        self, sub: str, *, node: str = "", audience: str = AUDIENCE, expiration_s: int = 3600,
        namespace: str = "dra-suite",
    ) -> str:  # fmt: skip
        kube: dict[str, Any] = {"namespace": namespace, "serviceaccount": {"name": sub, "uid": "u"}}
        if node:
            kube |= {"pod": {"name": f"pod-{node}", "uid": "p"}, "node": {"name": node, "uid": "n"}}
        claims = {"aud": [audience], "sub": sub, "jti": "j", "kubernetes.io": kube}
        token, _ = self.signer.issue(claims, expiration_s=expiration_s)
        return token
