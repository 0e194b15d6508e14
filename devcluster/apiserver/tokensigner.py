"""The emulated cluster's ServiceAccount token signer, as kube-apiserver signs: RS256 JWTs from
an RSA key of the cluster's own, the key ID kube derives (the unpadded base64url SHA-256 of the
public key's DER), and the public half published as a JWKS for OIDC discovery.

No I/O. The key is made on first use, so an emulator that never issues a token never pays for
it. `clock` and `min_expiration_s` are for tests: kube refuses token lifetimes under ten
minutes, and a test of expiry lowers that or moves the clock.
"""

from __future__ import annotations

import base64
import hashlib
import time
from collections.abc import Callable
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

__all__ = ["ALGORITHM", "ISSUER", "TokenIssuer"]

ISSUER = "https://kubernetes.default.svc.cluster.local"
ALGORITHM = "RS256"


class TokenIssuer:
    """The cluster's ServiceAccount token signer; `clock` and `min_expiration_s` are for tests
    (kube refuses lifetimes under 10 minutes; a test of expiry lowers that)."""

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._key: rsa.RSAPrivateKey | None = None
        self.clock = clock
        self.min_expiration_s = 600

    @property
    def key(self) -> rsa.RSAPrivateKey:
        if self._key is None:
            self._key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        return self._key

    @property
    def key_id(self) -> str:
        der = self.key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        return base64.urlsafe_b64encode(hashlib.sha256(der).digest()).rstrip(b"=").decode()

    def issue(self, claims: dict[str, Any], *, expiration_s: int) -> tuple[str, int]:
        now = int(self.clock())
        exp = now + expiration_s
        body = {**claims, "iss": ISSUER, "iat": now, "nbf": now, "exp": exp}
        headers = {"kid": self.key_id}
        return jwt.encode(body, self.key, algorithm=ALGORITHM, headers=headers), exp

    def verify(self, token: str) -> dict[str, Any]:
        """The claims; raises jwt.InvalidTokenError (expired, bad signature, malformed)."""
        # Expiry against our own clock (tests move it); kube checks it the same way.
        claims: dict[str, Any] = jwt.decode(
            token, self.key.public_key(), algorithms=[ALGORITHM], issuer=ISSUER,
            options={"verify_aud": False, "verify_exp": False, "verify_nbf": False,
                     "verify_iat": False, "require": ["exp", "iat", "nbf", "sub"]},
        )  # fmt: skip
        if claims["exp"] <= self.clock():
            raise jwt.ExpiredSignatureError("token has expired")
        return claims

    def jwks(self) -> dict[str, Any]:
        """The key set kube-apiserver serves at /openid/v1/jwks."""
        numbers = self.key.public_key().public_numbers()
        return {
            "keys": [
                {
                    "use": "sig",
                    "kty": "RSA",
                    "kid": self.key_id,
                    "alg": ALGORITHM,
                    "n": _b64_uint(numbers.n),
                    "e": _b64_uint(numbers.e),
                }
            ]
        }


def _b64_uint(value: int) -> str:
    raw = value.to_bytes((value.bit_length() + 7) // 8, "big")
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
