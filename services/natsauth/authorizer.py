"""One authorization: the server's request in, the signed response out, never an exception.

Order, cheapest first, so that a flood of junk costs the API server nothing: open and check
the request (one the server has already given up on, past its `exp`, is dropped unanswered),
check the token locally (`localcheck`: signature against the issuer's JWKS, audience, expiry,
node binding), refuse a revoked node, then the TokenReview (from the bounded cache when the
same token was reviewed lately, else rate-limited per client address), whose `audiences` must
name ours; map the identity, derive its permissions, and admit it until the earlier of the
token's expiry and the session cap, so every session ends and is reviewed again at the next
connect. Every refusal carries a reason label for metrics and a detail for the log; neither
holds the token.

`screen` is the part of that which needs no I/O and no signature of ours, run on every
request in arrival order before any is handed on: junk ends there, and beyond a small budget
of answers per second it is not even answered (nats-server refuses it when its auth timeout
passes), so a flood neither queues ahead of real tokens nor gets its next attempt sooner.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from services.natsauth import callout, identity, permissions, provisioner
from services.natsauth.identity import Identity, Policy, Refusal
from services.natsauth.keys import SigningKey
from services.natsauth.localcheck import LocalCheck, TokenClaims
from services.natsauth.ratelimit import SourceLimiter
from services.natsauth.reviewcache import ReviewCache
from services.natsauth.tokenreview import TokenReviewer
from shared.bus.subjects import Names
from shared.errors import DraSuiteError

__all__ = ["DEFAULT_MAX_SESSION_S", "Authorizer", "Decision"]

log = structlog.get_logger(__name__)
DEFAULT_MAX_SESSION_S = 3600
_REFUSAL_LOGS_PER_S = 5.0
_ANSWERED = "answered"


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    reason: str
    """`allowed`, or why not (a metrics label)."""
    role: str = ""
    node: str = ""
    response: str = ""
    """The signed authorization response JWT; empty when nobody is answered (nats-server
    then refuses the client when its auth timeout passes)."""


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
        local: LocalCheck,
        clock: Callable[[], float] = time.time,
        provisioner: Callable[[str], bool] = lambda token: False,
        certifier: Callable[[str], bool] = lambda token: False,
        auditor: Callable[[str], str] = lambda token: "",
        cache: ReviewCache | None = None,
        limiter: SourceLimiter | None = None,
        max_session_s: int = DEFAULT_MAX_SESSION_S,
        revoked: Callable[[str], bool] = lambda node: False,
        answered_refusals: SourceLimiter | None = None,
    ) -> None:
        """`provisioner` tells this process's own provisioning token (`provisioner`),
        `certifier` its certifying connection's (`certifier`), `auditor` the replica id of
        its quota auditor's connection for that one's token ("" for any other); `revoked`
        tells a node whose bus identity an operator has cut; `answered_refusals` bounds how
        many refusals found by `screen` are answered (None: all)."""
        self._reviewer = reviewer
        self._policy = policy
        self._drivers = tuple(drivers)
        self._names = names
        self._account = account
        self._audience = audience
        self._issuer = issuer
        self._clock = clock
        self._provisioner = provisioner
        self._certifier = certifier
        self._auditor = auditor
        self._local = local
        self._cache = cache if cache is not None else ReviewCache(max_entries=0, ttl_s=0)
        self._limiter = limiter if limiter is not None else SourceLimiter(rate_per_s=0, burst=0)
        self._max_session_s = max_session_s
        self._revoked = revoked
        self._log_budget = SourceLimiter(rate_per_s=_REFUSAL_LOGS_PER_S, burst=20)
        self._answers = answered_refusals or SourceLimiter(rate_per_s=0, burst=0)

    def screen(self, request_jwt: str) -> Decision | None:
        """What the request and its token show by themselves, from what is in memory: a
        Decision for a token that cannot pass (unanswered beyond the answer budget), None
        when the request needs `authorize` (which does it all again, verified)."""
        try:
            request = callout.peek_request(request_jwt)
        except callout.CalloutError:
            return None  # only nats-server sends here; `authorize` logs what is wrong
        now = self._clock()
        token = request.token
        if not token:
            refusal: TokenClaims | Refusal | None = Refusal("no_token", "the client sent no token")
        elif self._provisioner(token) or self._certifier(token) or self._auditor(token):
            return None
        else:
            refusal = self._local.screen(token, now=now)
        if not isinstance(refusal, Refusal) or self._answers.allow(_ANSWERED, now=now):
            return None
        self._log_refusal(request, refusal, now=now, answered=False)
        return Decision(allowed=False, reason=refusal.reason)

    async def authorize(self, request_jwt: str) -> Decision:
        try:
            request = callout.parse_request(request_jwt)
        except callout.CalloutError as exc:
            log.warning("nats_auth_request_invalid", error=str(exc))
            return Decision(allowed=False, reason="bad_request")
        now = self._clock()
        if request.expires_at is not None and request.expires_at <= now:
            log.info("nats_auth_request_expired", client=request.client_name)
            return Decision(allowed=False, reason="request_expired")
        found: Identity
        if request.token and self._provisioner(request.token):
            found = Identity(role=permissions.PROVISIONER)
            expires_at = int(now) + provisioner.LEASE_S
        elif request.token and self._certifier(request.token):
            found = Identity(role=permissions.CERTIFIER)
            expires_at = int(now) + self._max_session_s
        elif request.token and (replica := self._auditor(request.token)):
            found = Identity(role=permissions.AUDITOR, node=replica)
            expires_at = int(now) + self._max_session_s
        else:
            reviewed = await self._identify(request, now=now)
            if isinstance(reviewed, Refusal):
                return self._refuse(request, reviewed, now=now)
            found, expires_at = reviewed
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

    async def _identify(
        self, request: callout.AuthRequest, *, now: float
    ) -> tuple[Identity, int] | Refusal:
        token = request.token
        if not token:
            return Refusal("no_token", "the client sent no token")
        claims = await self._local.check(token, now=now)
        if isinstance(claims, Refusal):
            return claims
        if claims.node and self._revoked(claims.node):
            return Refusal("node_revoked", f"node {claims.node!r} is revoked")
        status = await self._review(token, claims, request.client_host, now=now)
        if isinstance(status, Refusal):
            return status
        found = identity.identify(status, self._policy)
        if isinstance(found, Refusal):
            return found
        if found.node != claims.node and found.role != "operator":
            return Refusal("node_mismatch", f"reviewed node {found.node!r} is not the token's")
        return found, min(claims.expires_at, int(now) + self._max_session_s)

    async def _review(
        self, token: str, claims: TokenClaims, source: str, *, now: float
    ) -> Mapping[str, Any] | Refusal:
        cached = self._cache.get(token, now=now)
        if cached is not None:
            return cached
        if not self._limiter.allow(source, now=now):
            return Refusal("rate_limited", f"too many reviews for {source}")
        try:
            status = await self._reviewer.review(token, audience=self._audience)
        except DraSuiteError as exc:
            return Refusal("review_failed", f"token review failed: {exc}")
        if status.get("authenticated") is True:
            audiences = status.get("audiences")
            if not isinstance(audiences, list) or self._audience not in audiences:
                return Refusal(
                    "review_audience", f"the review vouches for {audiences!r}, not our audience"
                )
            self._cache.put(token, status, node=claims.node, expires_at=claims.expires_at, now=now)
        return status

    def _log_refusal(
        self, request: callout.AuthRequest, refusal: Refusal, *, now: float, answered: bool
    ) -> None:
        # Every refusal is counted (`dra_nats_auth_decisions_total`); the log gets a few per
        # second and reason, so a junk flood does not turn into a flood of log lines.
        if self._log_budget.allow(refusal.reason, now=now):
            log.warning(
                "nats_client_refused", reason=refusal.reason, detail=refusal.detail,
                client=request.client_name, host=request.client_host, answered=answered,
                security=True,
            )  # fmt: skip

    def _refuse(self, request: callout.AuthRequest, refusal: Refusal, *, now: float) -> Decision:
        self._log_refusal(request, refusal, now=now, answered=True)
        response = callout.error_response(
            request, f"not authorized: {refusal.reason}", issuer=self._issuer, now=now
        )
        return Decision(allowed=False, reason=refusal.reason, response=response)
