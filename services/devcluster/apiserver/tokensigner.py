"""The emulated cluster's ServiceAccount token signer: HS256 JWTs only this emulator verifies.

No I/O. `clock` and `min_expiration_s` are for tests: kube refuses token lifetimes under ten
minutes, and a test of expiry lowers that or moves the clock.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from typing import Any

import jwt

__all__ = ["ISSUER", "TokenIssuer"]

ISSUER = "https://kubernetes.default.svc.cluster.local"
_ALGORITHM = "HS256"


class TokenIssuer:
    """The cluster's ServiceAccount token signer; `clock` and `min_expiration_s` are for tests
    (kube refuses lifetimes under 10 minutes; a test of expiry lowers that)."""

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._secret = secrets.token_bytes(32)
        self.clock = clock
        self.min_expiration_s = 600

    def issue(self, claims: dict[str, Any], *, expiration_s: int) -> tuple[str, int]:
        now = int(self.clock())
        exp = now + expiration_s
        body = {**claims, "iss": ISSUER, "iat": now, "nbf": now, "exp": exp}
        return jwt.encode(body, self._secret, algorithm=_ALGORITHM), exp

    def verify(self, token: str) -> dict[str, Any]:
        """The claims; raises jwt.InvalidTokenError (expired, bad signature, malformed)."""
        # Expiry against our own clock (tests move it); kube checks it the same way.
        claims: dict[str, Any] = jwt.decode(
            token, self._secret, algorithms=[_ALGORITHM], issuer=ISSUER,
            options={"verify_aud": False, "verify_exp": False, "verify_nbf": False,
                     "verify_iat": False, "require": ["exp", "iat", "nbf", "sub"]},
        )  # fmt: skip
        if claims["exp"] <= self.clock():
            raise jwt.ExpiredSignatureError("token has expired")
        return claims
