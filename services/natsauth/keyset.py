"""The ServiceAccount token issuer's public keys, from OIDC discovery, cached.

kube-apiserver publishes its issuer at `/.well-known/openid-configuration` and the signing
keys at the discovery document's `jwks_uri` (`/openid/v1/jwks`, served only as
`application/jwk-set+json`); reading both is what the ClusterRole
`system:service-account-issuer-discovery` grants. The keys are fetched once and again when a
token names a key ID we do not hold (the API server rotated its key), but at most once per
`min_refresh_s`: a flood of tokens with made-up key IDs costs one fetch, not one per token.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

import jwt
import structlog

from shared.errors import DraSuiteError

__all__ = ["DISCOVERY_PATH", "JWKS_TYPE", "Fetch", "IssuerKeys", "KeySetError"]

log = structlog.get_logger(__name__)
DISCOVERY_PATH = "/.well-known/openid-configuration"
JWKS_TYPE = "application/jwk-set+json"
_ALGORITHMS = frozenset({"RS256", "ES256"})


class KeySetError(DraSuiteError):
    """Discovery or the key set could not be read, or is not what kube-apiserver serves."""


class Fetch(Protocol):
    async def __call__(self, path: str, *, accept: str) -> bytes:
        """GET `path` on the API server with `Accept: accept`; raises DraSuiteError."""
        ...


@dataclass(frozen=True, slots=True)
class _Snapshot:
    issuer: str
    keys: Mapping[str, jwt.PyJWK]
    fetched_at: float


def _json_object(data: bytes, what: str) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except ValueError as exc:
        raise KeySetError(f"{what}: not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise KeySetError(f"{what}: not a JSON object")
    return value


def _keys(document: Mapping[str, Any]) -> dict[str, jwt.PyJWK]:
    found: dict[str, jwt.PyJWK] = {}
    for entry in document.get("keys") or ():
        if not isinstance(entry, dict) or entry.get("use", "sig") != "sig":
            continue
        kid, alg = entry.get("kid"), entry.get("alg")
        if not isinstance(kid, str) or alg not in _ALGORITHMS:
            continue
        try:
            found[kid] = jwt.PyJWK(entry, algorithm=alg)
        except jwt.PyJWTError as exc:
            log.warning("jwks_key_skipped", kid=kid, error=str(exc))
    return found


class IssuerKeys:
    def __init__(
        self, fetch: Fetch, *, min_refresh_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:  # fmt: skip
        self._fetch = fetch
        self._min_refresh_s = min_refresh_s
        self._clock = clock
        self._snapshot: _Snapshot | None = None
        self._attempted_at = -float("inf")
        self._lock = asyncio.Lock()
        self.fetches = 0

    async def issuer(self) -> str:
        """The issuer tokens must name (`iss`), as discovery states it."""
        return (await self._current()).issuer

    async def key(self, kid: str) -> jwt.PyJWK | None:
        """The key with ID `kid`, refreshing the set once if it is unknown (rate-limited)."""
        snapshot = await self._current()
        if kid in snapshot.keys:
            return snapshot.keys[kid]
        async with self._lock:
            snapshot = self._snapshot or snapshot
            if kid not in snapshot.keys and self._may_fetch():
                try:
                    snapshot = await self._refresh()
                except DraSuiteError as exc:  # keep the keys we have
                    log.warning("jwks_refresh_failed", error=str(exc))
        return snapshot.keys.get(kid)

    def at_hand(self, kid: str) -> tuple[str, jwt.PyJWK | None] | None:
        """The issuer and the key `kid` from the keys held, never fetching: the key is None
        when the issuer does not publish it (and a refresh is not due yet); None when only a
        fetch can tell (no keys yet, or an unknown ID while a refresh is allowed)."""
        snapshot = self._snapshot
        if snapshot is None:
            return None
        key = snapshot.keys.get(kid)
        if key is None and self._may_fetch():
            return None
        return snapshot.issuer, key

    def _may_fetch(self) -> bool:
        return self._clock() - self._attempted_at >= self._min_refresh_s

    async def _current(self) -> _Snapshot:
        if self._snapshot is not None:
            return self._snapshot
        async with self._lock:
            if self._snapshot is not None:
                return self._snapshot
            if not self._may_fetch():
                raise KeySetError("the issuer's keys are not fetched yet (retrying shortly)")
            return await self._refresh()

    async def _refresh(self) -> _Snapshot:
        self.fetches += 1
        self._attempted_at = self._clock()
        discovery = _json_object(
            await self._fetch(DISCOVERY_PATH, accept="application/json"), "OIDC discovery"
        )
        issuer, jwks_uri = discovery.get("issuer"), discovery.get("jwks_uri")
        if not isinstance(issuer, str) or not issuer or not isinstance(jwks_uri, str):
            raise KeySetError("OIDC discovery: no issuer or jwks_uri")
        # Always from the API server itself (the discovery role grants it there), whatever
        # host an external `--service-account-jwks-uri` names.
        path = urlsplit(jwks_uri).path or "/openid/v1/jwks"
        keys = _keys(_json_object(await self._fetch(path, accept=JWKS_TYPE), "JWKS"))
        if not keys:
            raise KeySetError("JWKS: no RS256/ES256 signing key")
        self._snapshot = _Snapshot(issuer=issuer, keys=keys, fetched_at=self._clock())
        log.info("jwks_fetched", issuer=issuer, kids=sorted(keys))
        return self._snapshot
