"""One authorization: the server's request in, the signed response out, never an exception.

Order: open and check the request, review the token (audience-bound), map the identity, derive
its permissions, and admit it until the token expires (so an expired token drops the
connection and the client reconnects with its rotated token). Every refusal carries a reason
label for metrics and a detail for the log; neither holds the token.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import jwt
import structlog

from services.natsauth import callout, identity, permissions, provisioner
from services.natsauth.identity import Identity, Policy, Refusal
from services.natsauth.keys import SigningKey
from services.natsauth.tokenreview import TokenReviewer
from shared.bus.subjects import Names
from shared.errors import DraSuiteError

__all__ = ["Authorizer", "Decision"]

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    reason: str
    """`allowed`, or why not (a metrics label)."""
    role: str = ""
    node: str = ""
    response: str = ""
    """The signed authorization response JWT; empty when the request itself was unreadable."""


def _token_expiry(token: str) -> int | None:
    """The `exp` of a token the API server has just vouched for (so its claims hold)."""
    try:
        claims = jwt.decode(token, options={"verify_signature": False})
    except jwt.InvalidTokenError:
        return None
    exp = claims.get("exp")
    return exp if isinstance(exp, int) else None


class Authorizer:
    def __init__(
        self,
        *,
        reviewer: TokenReviewer,
        policy: Policy,
        drivers: Iterable[str],
        names: Names,
        account: str,
        audience: str,
        issuer: SigningKey,
        clock: Callable[[], float] = time.time,
        provisioner: Callable[[str], bool] = lambda token: False,
    ) -> None:
        """`provisioner` tells this process's own provisioning token (`provisioner`)."""
        self._reviewer = reviewer
        self._policy = policy
        self._drivers = tuple(drivers)
        self._names = names
        self._account = account
        self._audience = audience
        self._issuer = issuer
        self._clock = clock
        self._provisioner = provisioner

    async def authorize(self, request_jwt: str) -> Decision:
        try:
            request = callout.parse_request(request_jwt)
        except callout.CalloutError as exc:
            log.warning("nats_auth_request_invalid", error=str(exc))
            return Decision(allowed=False, reason="bad_request")
        now = self._clock()
        found: Identity
        if request.token and self._provisioner(request.token):
            found = Identity(role=permissions.PROVISIONER)
            expires_at: int | None = int(now) + provisioner.LEASE_S
        else:
            reviewed = await self._identify(request.token)
            if isinstance(reviewed, Refusal):
                return self._refuse(request, reviewed, now=now)
            found, expires_at = reviewed, _token_expiry(request.token)
        if expires_at is None or expires_at <= now:
            return self._refuse(request, Refusal("token_expiry", "token without expiry"), now=now)
        grants = permissions.for_identity(found, drivers=self._drivers, names=self._names)
        name = f"{found.role}/{found.node}" if found.node else f"{found.role}/{found.username}"
        response = callout.user_response(
            request, grants, name=name, account=self._account,
            expires_at=expires_at, issuer=self._issuer, now=now,
        )  # fmt: skip
        log.info(
            "nats_client_authorized", role=found.role, node=found.node or None,
            user=found.username, client=request.client_name, expires_at=expires_at,
        )  # fmt: skip
        return Decision(True, "allowed", found.role, found.node, response)

    async def _identify(self, token: str) -> Identity | Refusal:
        if not token:
            return Refusal("no_token", "the client sent no token")
        try:
            status = await self._reviewer.review(token, audience=self._audience)
        except DraSuiteError as exc:
            return Refusal("review_failed", f"token review failed: {exc}")
        return identity.identify(status, self._policy)

    def _refuse(self, request: callout.AuthRequest, refusal: Refusal, *, now: float) -> Decision:
        log.warning(
            "nats_client_refused", reason=refusal.reason, detail=refusal.detail,
            client=request.client_name, host=request.client_host, security=True,
        )  # fmt: skip
        response = callout.error_response(
            request, f"not authorized: {refusal.reason}", issuer=self._issuer, now=now
        )
        return Decision(allowed=False, reason=refusal.reason, response=response)
