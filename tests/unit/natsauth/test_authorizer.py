"""One authorization end to end over a fake TokenReview and a local key set: admitted, or
refused with a reason, and the API server asked only about tokens that pass the local check."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jwt
import nkeys  # type: ignore[import-untyped]  # ships no type hints
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from services.natsauth import nkeyjwt
from services.natsauth.authorizer import Authorizer, Decision
from services.natsauth.identity import Policy
from services.natsauth.keyset import IssuerKeys
from services.natsauth.localcheck import LocalCheck
from services.natsauth.ratelimit import SourceLimiter
from services.natsauth.reviewcache import ReviewCache
from shared.bus.subjects import Names
from shared.errors import KubeTransientError
from tests.unit.natsauth.issuer import AUDIENCE, Cluster
from tests.unit.natsauth.test_callout import ISSUER, SERVER, request_claims

NOW = 1_900_000_000
AGENT = "system:serviceaccount:dra-suite:dra-health"
OPERATOR = "system:serviceaccount:dra-suite:dra-operator"
POLICY = Policy(
    agent_namespace="dra-suite", operator_users=frozenset({OPERATOR}), operator_groups=frozenset()
)


class FakeTokenReviewer:
    """Answers from a table of token -> TokenReview status; records the tokens asked about."""

    def __init__(self, answers: Mapping[str, Any], *, fail: bool = False) -> None:
        self.answers = answers
        self.fail = fail
        self.asked: list[str] = []
        self.audiences: list[str] = []

    async def review(self, token: str, *, audience: str) -> Mapping[str, Any]:
        self.asked.append(token)
        self.audiences.append(audience)
        if self.fail:
            raise KubeTransientError("create tokenreviews: 503")
        if token in self.answers:
            answer: Mapping[str, Any] = self.answers[token]
            return answer
        return {"authenticated": False, "error": "invalid bearer token"}


def reviewed(user: str = AGENT, node: str = "node-a", audiences: Any = (AUDIENCE,)) -> Any:
    extra = {"authentication.kubernetes.io/node-name": [node]} if node else {}
    return {
        "authenticated": True, "audiences": list(audiences),
        "user": {"username": user, "groups": [], "extra": extra},
    }  # fmt: skip


@pytest.fixture
def cluster() -> Cluster:
    return Cluster(now=NOW)


def agent_token(cluster: Cluster, **options: Any) -> str:
    return cluster.token(AGENT, node="node-a", **options)


def authorizer(
    cluster: Cluster, reviewer: FakeTokenReviewer, *, clock: list[float] | None = None,
    **options: Any,
) -> Authorizer:  # fmt: skip
    now = clock if clock is not None else [NOW]
    keys = IssuerKeys(cluster.fetch, clock=lambda: now[0])
    return Authorizer(
        reviewer=reviewer, policy=POLICY, drivers=["sim.dra-suite.io"], names=Names(""),
        account="DRA", audience=AUDIENCE, issuer=ISSUER, clock=lambda: now[0],
        local=LocalCheck(keys, audience=AUDIENCE, policy=POLICY), **options,
    )  # fmt: skip


def request(token: str, *, exp: int | None = None, host: str = "10.0.0.7") -> str:
    claims = request_claims(
        connect_opts={"auth_token": token}, client_info={"host": host, "kind": "Client"}
    )
    if exp is not None:
        claims["exp"] = exp
    return nkeyjwt.encode(claims, signer=SERVER, now=NOW)


def user_claims(decision: Decision) -> dict[str, Any]:
    response = nkeyjwt.verify(
        decision.response, issuer=ISSUER.public, prefix=nkeys.PREFIX_BYTE_ACCOUNT
    )
    return nkeyjwt.unverified_claims(response["nats"]["jwt"])


async def test_an_agent_is_admitted_until_its_token_expires(cluster: Cluster):
    token = agent_token(cluster, expiration_s=600)
    reviewer = FakeTokenReviewer({token: reviewed()})
    decision = await authorizer(cluster, reviewer).authorize(request(token))
    assert (decision.allowed, decision.role, decision.node) == (True, "health", "node-a")
    assert reviewer.audiences == [AUDIENCE]
    assert user_claims(decision)["exp"] == NOW + 600


async def test_a_long_token_gets_a_session_no_longer_than_the_cap(cluster: Cluster):
    token = cluster.token(OPERATOR, expiration_s=30 * 86400)  # minted for a month
    reviewer = FakeTokenReviewer({token: reviewed(OPERATOR, node="")})
    decision = await authorizer(cluster, reviewer, max_session_s=900).authorize(request(token))
    assert (decision.allowed, decision.role) == (True, "operator")
    assert user_claims(decision)["exp"] == NOW + 900


def _foreign_token(cluster: Cluster) -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    claims = {"sub": AGENT, "aud": [AUDIENCE], "exp": NOW + 600, "iss": "x"}
    return jwt.encode(claims, key, algorithm="RS256", headers={"kid": cluster.signer.key_id})


LOCAL_REFUSALS: dict[str, tuple[Any, str]] = {
    "random junk": (lambda c: "opaque-unknown-token", "token_malformed"),
    "HS256 with kube's kid": (
        lambda c: jwt.encode({"sub": AGENT}, "k" * 32, headers={"kid": c.signer.key_id}),
        "token_signature",
    ),
    "signed by another key under kube's kid": (_foreign_token, "token_signature"),
    "an unknown kid": (
        lambda c: jwt.encode({"sub": AGENT}, "k" * 32, headers={"kid": "nope"}),
        "token_signature",
    ),
    "another audience": (lambda c: agent_token(c, audience="api"), "token_audience"),
    "expired": (lambda c: agent_token(c, expiration_s=-1), "token_expired"),
    "an agent token bound to no pod": (lambda c: c.token(AGENT), "no_node_binding"),
    "another namespace's account": (
        lambda c: c.token("system:serviceaccount:other:dra-health", node="node-a"),
        "unknown_identity",
    ),
}


@pytest.mark.parametrize(("make", "reason"), LOCAL_REFUSALS.values(), ids=LOCAL_REFUSALS)
async def test_junk_is_refused_without_asking_the_api_server(
    cluster: Cluster, make: Any, reason: str
):
    token = make(cluster)
    reviewer = FakeTokenReviewer({token: reviewed()})  # it would vouch, were it asked
    decision = await authorizer(cluster, reviewer).authorize(request(token))
    assert (decision.allowed, decision.reason) == (False, reason)
    assert reviewer.asked == []
    response = nkeyjwt.verify(
        decision.response, issuer=ISSUER.public, prefix=nkeys.PREFIX_BYTE_ACCOUNT
    )
    assert response["nats"]["error"] == f"not authorized: {reason}"
    assert token not in decision.response  # the token never leaks


async def test_junk_kids_cost_one_key_fetch_per_interval(cluster: Cluster):
    auth = authorizer(cluster, FakeTokenReviewer({}))
    for index in range(50):
        junk = jwt.encode({"sub": AGENT}, "k" * 32, headers={"kid": f"kid-{index}"})
        assert (await auth.authorize(request(junk))).reason == "token_signature"
    assert cluster.fetched.count("/openid/v1/jwks") == 1


REVIEW_REFUSALS: dict[str, tuple[Any, bool, str]] = {
    "no token": (None, False, "no_token"),
    "the API server no longer knows it (pod gone)": ({}, False, "token_invalid"),
    "the API server down": (reviewed(), True, "review_failed"),
    "a review for no audience": (reviewed(audiences=()), False, "review_audience"),
    "a review for another audience": (reviewed(audiences=["api"]), False, "review_audience"),
    "a review naming another node": (reviewed(node="node-b"), False, "node_mismatch"),
}


@pytest.mark.parametrize(
    ("answer", "fail", "reason"), REVIEW_REFUSALS.values(), ids=REVIEW_REFUSALS
)
async def test_a_review_refusal_names_its_reason(
    cluster: Cluster, answer: Any, fail: bool, reason: str
):
    token = "" if answer is None else agent_token(cluster)
    reviewer = FakeTokenReviewer({token: answer} if answer else {}, fail=fail)
    decision = await authorizer(cluster, reviewer).authorize(request(token))
    assert (decision.allowed, decision.reason) == (False, reason)


async def test_an_expired_request_is_dropped_unreviewed(cluster: Cluster):
    token = agent_token(cluster)
    reviewer = FakeTokenReviewer({token: reviewed()})
    decision = await authorizer(cluster, reviewer).authorize(request(token, exp=NOW - 1))
    assert (decision.allowed, decision.reason, decision.response) == (
        False, "request_expired", ""
    )  # fmt: skip
    assert reviewer.asked == []
    assert (await authorizer(cluster, reviewer).authorize(request(token, exp=NOW + 2))).allowed


async def test_a_reconnect_storm_of_one_token_is_reviewed_once_until_the_cache_expires(
    cluster: Cluster,
):
    token = agent_token(cluster)
    reviewer = FakeTokenReviewer({token: reviewed()})
    clock = [float(NOW)]
    auth = authorizer(cluster, reviewer, clock=clock,
                      cache=ReviewCache(max_entries=10, ttl_s=60))  # fmt: skip
    for _ in range(20):
        assert (await auth.authorize(request(token))).allowed
    assert len(reviewer.asked) == 1
    clock[0] += 61
    assert (await auth.authorize(request(token))).allowed
    assert len(reviewer.asked) == 2


async def test_reviews_are_rate_limited_per_source(cluster: Cluster):
    tokens = [agent_token(cluster, expiration_s=600 + i) for i in range(5)]
    reviewer = FakeTokenReviewer({token: reviewed() for token in tokens})
    auth = authorizer(cluster, reviewer, limiter=SourceLimiter(rate_per_s=0.001, burst=3))
    reasons = [(await auth.authorize(request(t, host="10.0.0.9"))).reason for t in tokens[:4]]
    assert reasons == ["allowed"] * 3 + ["rate_limited"]
    assert (await auth.authorize(request(tokens[4], host="10.0.0.10"))).allowed


async def test_a_revoked_node_is_refused_before_any_review(cluster: Cluster):
    token = agent_token(cluster)
    reviewer = FakeTokenReviewer({token: reviewed()})
    auth = authorizer(cluster, reviewer, revoked=lambda node: node == "node-a")
    assert (await auth.authorize(request(token))).reason == "node_revoked"
    assert reviewer.asked == []


async def test_an_unreadable_request_gets_no_response(cluster: Cluster):
    decision = await authorizer(cluster, FakeTokenReviewer({})).authorize("garbage")
    assert (decision.allowed, decision.reason, decision.response) == (False, "bad_request", "")
