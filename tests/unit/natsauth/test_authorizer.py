"""One authorization end to end over a fake TokenReview: admitted, or refused with a reason."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jwt
import nkeys  # type: ignore[import-untyped]  # ships no type hints
import pytest

from services.natsauth import nkeyjwt
from services.natsauth.authorizer import Authorizer
from services.natsauth.identity import Policy
from shared.bus.subjects import Names
from shared.errors import KubeTransientError
from tests.unit.natsauth.test_callout import ISSUER, SERVER, request_claims

NOW = 1_900_000_000
AGENT = "system:serviceaccount:dra-suite:dra-health"


class FakeTokenReviewer:
    """Answers from a table of token -> TokenReview status; records the audiences asked."""

    def __init__(self, answers: Mapping[str, Any], *, fail: bool = False) -> None:
        self.answers = answers
        self.fail = fail
        self.audiences: list[str] = []

    async def review(self, token: str, *, audience: str) -> Mapping[str, Any]:
        self.audiences.append(audience)
        if self.fail:
            raise KubeTransientError("create tokenreviews: 503")
        if token in self.answers:
            answer: Mapping[str, Any] = self.answers[token]
            return answer
        return {"authenticated": False, "error": "invalid bearer token"}


def sa_token(exp: int | None) -> str:
    claims = {"sub": AGENT} | ({"exp": exp} if exp is not None else {})
    return jwt.encode(claims, "k" * 32, algorithm="HS256")


def health_agent() -> dict[str, Any]:
    extra = {"authentication.kubernetes.io/node-name": ["node-a"]}
    return {"authenticated": True, "user": {"username": AGENT, "groups": [], "extra": extra}}


def authorizer(reviewer: FakeTokenReviewer) -> Authorizer:
    return Authorizer(
        reviewer=reviewer,
        policy=Policy(
            agent_namespace="dra-suite", operator_users=frozenset(), operator_groups=frozenset()
        ),
        drivers=["sim.dra-suite.io"], names=Names(""), account="DRA",
        audience="nats.dra-suite.io", issuer=ISSUER, clock=lambda: NOW,
    )  # fmt: skip


def request(token: str) -> str:
    return nkeyjwt.encode(request_claims(connect_opts={"auth_token": token}), signer=SERVER)


async def test_an_agent_is_admitted_until_its_token_expires():
    token = sa_token(NOW + 600)
    reviewer = FakeTokenReviewer({token: health_agent()})
    decision = await authorizer(reviewer).authorize(request(token))
    assert (decision.allowed, decision.role, decision.node) == (True, "health", "node-a")
    assert reviewer.audiences == ["nats.dra-suite.io"]
    response = nkeyjwt.verify(
        decision.response, issuer=ISSUER.public, prefix=nkeys.PREFIX_BYTE_ACCOUNT
    )
    user = nkeyjwt.unverified_claims(response["nats"]["jwt"])
    assert user["exp"] == NOW + 600


REFUSALS: dict[str, tuple[str, Any, bool, str]] = {
    "no token": ("", {}, False, "no_token"),
    "a token the API server does not know": ("opaque-unknown-token", {}, False, "token_invalid"),
    "a token without expiry": (sa_token(None), None, False, "token_expiry"),
    "the API server down": (sa_token(NOW + 600), None, True, "review_failed"),
}


@pytest.mark.parametrize(("token", "answers", "fail", "reason"), REFUSALS.values(), ids=REFUSALS)
async def test_a_refusal_names_its_reason(token: str, answers: Any, fail: bool, reason: str):
    reviewer = FakeTokenReviewer(answers if answers is not None else {token: health_agent()},
                                 fail=fail)  # fmt: skip
    decision = await authorizer(reviewer).authorize(request(token))
    assert (decision.allowed, decision.reason) == (False, reason)
    response = nkeyjwt.verify(
        decision.response, issuer=ISSUER.public, prefix=nkeys.PREFIX_BYTE_ACCOUNT
    )
    assert response["nats"]["error"] == f"not authorized: {reason}"
    assert not token or token not in decision.response  # the token never leaks


async def test_an_unreadable_request_gets_no_response():
    decision = await authorizer(FakeTokenReviewer({})).authorize("garbage")
    assert (decision.allowed, decision.reason, decision.response) == (False, "bad_request", "")
