"""NATS JWTs (`alg: ed25519-nkey`) through PyJWT: encode with an nkey, verify with a public nkey.

PyJWT does the JWS framing, header checks and base64; this module registers the nkey algorithm
with a private `PyJWS` and adds what NATS JWTs carry: a `jti` that hashes the claims and `iat`.
The issuer of a token is only trusted after its signature checks against the key the caller
expected (never the `iss` the token names, unless the caller says that is the rule).
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import json
import time
from typing import Any

import jwt
import nacl.exceptions
import nacl.signing
from jwt.algorithms import Algorithm

from services.natsauth.keys import NKeyError, SigningKey, public_verify_key

__all__ = ["ALGORITHM", "JWTError", "encode", "unverified_claims", "verify"]

ALGORITHM = "ed25519-nkey"


class JWTError(ValueError):
    """A token that is malformed, not signed by the expected key, or of the wrong kind."""


class _NKeyAlgorithm(Algorithm):
    """Signs with a `SigningKey`, verifies with a nacl `VerifyKey`."""

    def prepare_key(self, key: Any) -> Any:
        if not isinstance(key, SigningKey | nacl.signing.VerifyKey):
            raise TypeError("an nkey JWT needs a SigningKey or a VerifyKey")
        return key

    def sign(self, msg: bytes, key: Any) -> bytes:
        signer: SigningKey = key
        return signer.sign(msg)

    def verify(self, msg: bytes, key: Any, sig: bytes) -> bool:
        verifier: nacl.signing.VerifyKey = key
        try:
            verifier.verify(msg, sig)
        except nacl.exceptions.BadSignatureError:
            return False
        return True

    @staticmethod
    def to_jwk(key_obj: Any, as_dict: bool = False) -> Any:
        raise NotImplementedError("nkeys have no JWK form")

    @staticmethod
    def from_jwk(jwk: Any) -> Any:
        raise NotImplementedError("nkeys have no JWK form")


# The few keys that sign requests (each server's own) are decoded once.
_verify_key = functools.lru_cache(maxsize=64)(public_verify_key)
_JWS = jwt.PyJWS(algorithms=[])
_JWS.register_algorithm(ALGORITHM, _NKeyAlgorithm())


def encode(claims: dict[str, Any], *, signer: SigningKey, now: float | None = None) -> str:
    """Sign `claims` as `signer` (its public key becomes `iss`), adding `iat` and `jti`."""
    body = {**claims, "iss": signer.public, "iat": int(time.time() if now is None else now)}
    body["jti"] = ""
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).digest()
    body["jti"] = base64.b32encode(digest).decode().rstrip("=")
    payload = json.dumps(body, separators=(",", ":")).encode()
    # PyJWT's key union lists its own key types only; ours is the registered algorithm's.
    key: Any = signer
    return _JWS.encode(payload, key=key, algorithm=ALGORITHM, headers={"typ": "JWT"})


def unverified_claims(token: str) -> dict[str, Any]:
    """The claims without any check: only for reading which key to verify with, or for
    sorting requests before any is verified. A third of PyJWT's cost: it skips the header."""
    parts = token.split(".")
    if len(parts) != 3:
        raise JWTError("not a JWT: not three dot-separated parts")
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (binascii.Error, ValueError) as exc:
        raise JWTError(f"not a JWT: {exc}") from None
    if not isinstance(claims, dict):
        raise JWTError("JWT claims are not an object")
    return claims


def verify(token: str, *, issuer: str, prefix: int) -> dict[str, Any]:
    """The claims of `token` once its signature checks against `issuer` (a public nkey)."""
    try:
        key: Any = _verify_key(issuer, prefix)
    except NKeyError as exc:
        raise JWTError(f"issuer key {issuer[:1]}...: {exc}") from None
    try:
        payload = _JWS.decode(token, key=key, algorithms=[ALGORITHM])
        claims = json.loads(payload)
    except (jwt.InvalidTokenError, ValueError) as exc:
        raise JWTError(f"JWT does not verify: {exc}") from None
    if not isinstance(claims, dict) or claims.get("iss") != issuer:
        raise JWTError("JWT issuer does not match the signing key")
    return claims
