"""What can be known about a token without asking the API server, checked before asking it.

The token must be a ServiceAccount token of this cluster: signed by a key of the issuer's JWKS
(by `kid`, RS256/ES256 only), naming that issuer, for our audience, not expired, and either an
operator's or one of our agents' bound to a pod on a node (the `kubernetes.io` claims). Only
then is it worth a TokenReview, which adds what a signature cannot show: that the
ServiceAccount and the pod still exist. Junk (random strings, forged or foreign signatures,
expired or unbound tokens) ends here, in microseconds, and never reaches the API server.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jwt

from services.natsauth.identity import AGENT_ROLES, Policy, Refusal
from services.natsauth.keyset import IssuerKeys
from shared.errors import DraSuiteError

__all__ = ["LocalCheck", "TokenClaims"]

_SA_PREFIX = "system:serviceaccount:"
_LEEWAY_S = 5


@dataclass(frozen=True, slots=True)
class TokenClaims:
    username: str
    expires_at: int
    node: str
    """The node of the bound pod; empty for an operator's unbound token."""


def _name(kube: Mapping[str, Any], key: str) -> str:
    value = kube.get(key)
    return str(value.get("name") or "") if isinstance(value, dict) else ""


def _key_id(token: str) -> str | Refusal:
    try:
        header = jwt.get_unverified_header(token)
    except jwt.PyJWTError:
        return Refusal("token_malformed", "not a JWT")
    kid = header.get("kid")
    if not isinstance(kid, str) or not kid:
        return Refusal("token_signature", "the token names no key ID")
    return kid


class LocalCheck:
    def __init__(self, keys: IssuerKeys, *, audience: str, policy: Policy) -> None:
        self._keys = keys
        self._audience = audience
        self._policy = policy

    async def check(self, token: str, *, now: float) -> TokenClaims | Refusal:
        kid = _key_id(token)
        if isinstance(kid, Refusal):
            return kid
        try:
            issuer = await self._keys.issuer()
            key = await self._keys.key(kid)
        except DraSuiteError as exc:
            return Refusal("keys_unavailable", f"the issuer's keys: {exc}")
        return self._verify(token, issuer, key, now=now)

    def screen(self, token: str, *, now: float) -> TokenClaims | Refusal | None:
        """`check` with the keys at hand, never waiting: None when only fetching the issuer's
        keys could tell (none fetched yet, or a key ID not seen since the last fetch)."""
        kid = _key_id(token)
        if isinstance(kid, Refusal):
            return kid
        held = self._keys.at_hand(kid)
        if held is None:
            return None
        return self._verify(token, *held, now=now)

    def _verify(
        self, token: str, issuer: str, key: jwt.PyJWK | None, *, now: float
    ) -> TokenClaims | Refusal:
        if key is None:
            return Refusal("token_signature", "signed by a key the issuer does not publish")
        try:
            # Times against our clock below (the service's, and the tests').
            claims = jwt.decode(
                token, key, algorithms=[key.algorithm_name], audience=self._audience,
                issuer=issuer, options={"require": ["exp", "sub"], "verify_exp": False,
                                        "verify_nbf": False, "verify_iat": False},
            )  # fmt: skip
        except jwt.InvalidAudienceError:
            return Refusal("token_audience", f"the token is not for {self._audience}")
        except jwt.PyJWTError as exc:
            return Refusal("token_signature", f"the token does not verify: {exc}")
        exp, nbf = claims["exp"], claims.get("nbf", 0)
        if not isinstance(exp, int) or exp <= now:
            return Refusal("token_expired", "the token has expired")
        if not isinstance(nbf, int) or nbf > now + _LEEWAY_S:
            return Refusal("token_expired", "the token is not valid yet")
        return self._bound(claims)

    def _bound(self, claims: Mapping[str, Any]) -> TokenClaims | Refusal:
        username = str(claims["sub"])
        kube = claims.get("kubernetes.io")
        kube = kube if isinstance(kube, dict) else {}
        node = _name(kube, "node")
        if username in self._policy.operator_users:
            return TokenClaims(username, claims["exp"], node)
        namespace = str(kube.get("namespace") or "")
        groups = {"system:serviceaccounts", f"system:serviceaccounts:{namespace}"}
        if groups & self._policy.operator_groups:
            return TokenClaims(username, claims["exp"], node)
        namespace, _, account = username.removeprefix(_SA_PREFIX).partition(":")
        if namespace != self._policy.agent_namespace or account not in AGENT_ROLES:
            return Refusal("unknown_identity", f"{username!r} is no dra-suite agent or operator")
        if not node or not _name(kube, "pod"):
            return Refusal("no_node_binding", f"{username!r}: the token is not bound to a pod")
        return TokenClaims(username, claims["exp"], node)
