"""Screening: junk settled as it arrives, from memory, and mostly left unanswered; anything
that may be a real token goes on to the full authorization."""

from __future__ import annotations

from typing import Any

import pytest

from services.natsauth.authorizer import Authorizer
from services.natsauth.ratelimit import SourceLimiter
from tests.unit.natsauth.issuer import Cluster
from tests.unit.natsauth.test_authorizer import (
    LOCAL_REFUSALS,
    NOW,
    FakeTokenReviewer,
    agent_token,
    authorizer,
    request,
    reviewed,
)

JUNK = {**LOCAL_REFUSALS, "no token": (lambda c: "", "no_token")}


@pytest.fixture
def cluster() -> Cluster:
    return Cluster(now=NOW)


async def _with_keys(auth: Authorizer, cluster: Cluster) -> None:
    """Have `auth` fetch the issuer's keys, as the service's first real connect does."""
    fetched = len(cluster.fetched)
    await auth.authorize(request(agent_token(cluster)))
    assert len(cluster.fetched) > fetched


@pytest.mark.parametrize(("make", "reason"), JUNK.values(), ids=JUNK)
async def test_junk_beyond_the_answer_budget_is_settled_unanswered(
    cluster: Cluster, make: Any, reason: str
):
    token = make(cluster)
    reviewer = FakeTokenReviewer({token: reviewed()})
    clock = [float(NOW)]
    auth = authorizer(cluster, reviewer, clock=clock,
                      answered_refusals=SourceLimiter(rate_per_s=1, burst=1))  # fmt: skip
    await _with_keys(auth, cluster)
    # Within the budget: on to `authorize`, which answers the refusal.
    assert auth.screen(request(token)) is None
    for _ in range(3):
        decision = auth.screen(request(token))
        assert decision is not None
        assert (decision.allowed, decision.reason, decision.response) == (False, reason, "")
    clock[0] += 1  # the budget refills
    assert auth.screen(request(token)) is None
    assert token not in reviewer.asked  # junk never reached the API server


async def test_a_token_that_may_pass_goes_on_to_the_full_path(cluster: Cluster):
    token = agent_token(cluster)
    auth = authorizer(cluster, FakeTokenReviewer({token: reviewed()}),
                      answered_refusals=SourceLimiter(rate_per_s=0.001, burst=1))  # fmt: skip
    assert auth.screen(request(token)) is None  # no keys fetched yet: not for screening to say
    await _with_keys(auth, cluster)
    auth.screen(request("junk"))  # spends the answer budget
    assert auth.screen(request(token)) is None
    revoked = authorizer(cluster, FakeTokenReviewer({}), revoked=lambda node: True)
    await _with_keys(revoked, cluster)
    assert revoked.screen(request(token)) is None  # revocation and review: `authorize`'s part


async def test_the_services_own_tokens_are_never_screened_out(cluster: Cluster):
    auth = authorizer(
        cluster, FakeTokenReviewer({}), provisioner=lambda token: token == "own-random-token",
        answered_refusals=SourceLimiter(rate_per_s=0.001, burst=1),
    )  # fmt: skip
    await _with_keys(auth, cluster)
    auth.screen(request("junk"))
    assert auth.screen(request("own-random-token")) is None


async def test_without_a_budget_every_refusal_is_answered(cluster: Cluster):
    auth = authorizer(cluster, FakeTokenReviewer({}))
    for _ in range(20):
        assert auth.screen(request("junk")) is None
        assert (await auth.authorize(request("junk"))).response
