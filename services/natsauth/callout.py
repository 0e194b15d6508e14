"""The auth callout's wire format: the server's authorization request, our response and user JWT.

nats-server (config mode, `authorization.auth_callout`) sends each connecting client's details
as a JWT signed by the server's own nkey, optionally sealed to our xkey; we answer with a JWT
signed by the issuer account key, carrying either a user JWT (account `aud`, permissions, `exp`)
or an error. Pure: no I/O, no clock of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import nkeys  # type: ignore[import-untyped]  # ships no type hints

from services.natsauth import nkeyjwt
from services.natsauth.keys import SigningKey
from services.natsauth.permissions import Permissions

__all__ = [
    "AuthRequest",
    "CalloutError",
    "error_response",
    "parse_request",
    "peek_request",
    "user_response",
]

_REQUEST_AUDIENCE = "nats-authorization-request"


class CalloutError(ValueError):
    """A request that is not a well-formed authorization request signed by its server."""


@dataclass(frozen=True, slots=True)
class AuthRequest:
    server_id: str
    """The server's public nkey (N...): the `aud` of our response."""
    user_nkey: str
    """The throwaway user key (U...) the server made for this connection: our JWT's `sub`."""
    token: str
    """What the client sent as `auth_token` (our agents: their ServiceAccount token)."""
    client_name: str
    client_host: str
    expires_at: int | None = None
    """The request's own `exp`: after it the server has given up on our answer."""


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise CalloutError(f"authorization request: {what} is missing or not text")
    return value


def parse_request(token: str) -> AuthRequest:
    """Check that the request is signed by the server it names, and read what we need."""
    try:
        issuer = _text(nkeyjwt.unverified_claims(token).get("iss"), "iss")
        claims = nkeyjwt.verify(token, issuer=issuer, prefix=nkeys.PREFIX_BYTE_SERVER)
    except nkeyjwt.JWTError as exc:
        raise CalloutError(f"authorization request: {exc}") from None
    return _read(claims, issuer=issuer)


def peek_request(token: str) -> AuthRequest:
    """Read the request without checking its signature: only to sort requests by what their
    tokens are worth, never to admit anyone (`parse_request` comes first for that)."""
    try:
        claims = nkeyjwt.unverified_claims(token)
    except nkeyjwt.JWTError as exc:
        raise CalloutError(f"authorization request: {exc}") from None
    return _read(claims, issuer=_text(claims.get("iss"), "iss"))


def _read(claims: dict[str, Any], *, issuer: str) -> AuthRequest:
    nats = claims.get("nats")
    if claims.get("aud") != _REQUEST_AUDIENCE or not isinstance(nats, dict):
        raise CalloutError("authorization request: not an authorization_request JWT")
    if nats.get("type") != "authorization_request":
        raise CalloutError("authorization request: not an authorization_request JWT")
    server = nats.get("server_id") or {}
    options = nats.get("connect_opts") or {}
    client = nats.get("client_info") or {}
    if not all(isinstance(part, dict) for part in (server, options, client)):
        raise CalloutError("authorization request: malformed server, client or connect options")
    server_id = _text(server.get("id"), "server_id.id")
    if server_id != issuer:
        raise CalloutError("authorization request: signed by another key than its server's")
    return AuthRequest(
        server_id=server_id,
        user_nkey=_text(nats.get("user_nkey"), "user_nkey"),
        token=str(options.get("auth_token") or ""),
        client_name=str(options.get("name") or ""),
        client_host=str(client.get("host") or ""),
        expires_at=exp if isinstance(exp := claims.get("exp"), int) else None,
    )


def _response(request: AuthRequest, body: dict[str, Any], *, issuer: SigningKey, now: float) -> str:
    claims = {
        "aud": request.server_id,
        "sub": request.user_nkey,
        "nats": {**body, "type": "authorization_response", "version": 2},
    }
    return nkeyjwt.encode(claims, signer=issuer, now=now)


def user_response(
    request: AuthRequest,
    permissions: Permissions,
    *,
    name: str,
    account: str,
    expires_at: int,
    issuer: SigningKey,
    now: float,
) -> str:
    """Admit the client into `account` with `permissions` until `expires_at` (unix seconds)."""
    user = {
        "aud": account,
        "sub": request.user_nkey,
        "name": name,
        "exp": expires_at,
        "nats": {
            **permissions.claims(),
            "type": "user",
            "version": 2,
        },
    }
    user_jwt = nkeyjwt.encode(user, signer=issuer, now=now)
    return _response(request, {"jwt": user_jwt}, issuer=issuer, now=now)


def error_response(request: AuthRequest, error: str, *, issuer: SigningKey, now: float) -> str:
    """Refuse the client; nats-server logs `error` and closes the connection."""
    return _response(request, {"error": error}, issuer=issuer, now=now)
