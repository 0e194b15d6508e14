"""A junk flood does not stop legitimate connects: while 1,500 clients with junk tokens
connect (from a process of their own), every agent's connect goes through, no junk token
reaches the API server, and the service answers no more junk than its answer budget: the rest
is refused by nats-server when its auth timeout passes, so the attacker gets no quicker next
try and no junk request is signed and sealed ahead of an agent's."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from bench.junk_connects import FloodProcess
from devcluster.apiserver import APIServerEmulator
from services.natsauth.tokenreview import KubeTokenReviewer
from shared.kube.client import KubeClient
from tests.integration.security.callout_stack import NODES, callout_stack, connected

pytestmark = pytest.mark.integration

JUNK = 1500
LEGIT = 20
_ANSWERED_REFUSAL = "Auth callout service returned an error"
"""What nats-server logs for each refusal the service answered (one it did not answer times
out instead)."""


class CountingReviewer:
    """The real TokenReview, counting the tokens it is asked about."""

    def __init__(self) -> None:
        self.inner: KubeTokenReviewer | None = None
        self.tokens: list[str] = []

    async def review(self, token: str, *, audience: str) -> Mapping[str, Any]:
        self.tokens.append(token)
        assert self.inner is not None
        return await self.inner.review(token, audience=audience)


async def test_agents_connect_while_junk_floods_the_callout(
    kube: APIServerEmulator, tmp_path: Path
):
    reviewer = CountingReviewer()
    async with callout_stack(kube, tmp_path, reviewer=reviewer) as stack:
        assert stack.config is not None
        client = await KubeClient.connect(stack.config.kube)
        reviewer.inner = KubeTokenReviewer(client)
        try:
            tokens = [await stack.token("dra-health", node=NODES[i % 2]) for i in range(LEGIT)]
            attack = await FloodProcess.start(
                stack.server.url, JUNK, kid=kube.cluster.tokens.key_id
            )
            took: list[float] = []
            for index, token in enumerate(tokens):
                started = time.monotonic()
                async with connected(stack.settings(token), component="health",
                                     node=NODES[index % 2], timeout_s=3):  # fmt: skip
                    took.append(time.monotonic() - started)
            result = await attack.result()
        finally:
            await client.close()
    assert len(took) == LEGIT  # every legitimate connect went through
    assert max(took) < 2.0, took  # inside nats-server's callout timeout
    assert result.seconds > sum(took) / 2, "the flood was over before the agents connected"
    assert (result.admitted, result.refused) == (0, JUNK)
    assert set(reviewer.tokens) <= set(tokens)  # junk never reached the API server
    budget = stack.config.refusals_answered_per_s
    answered = stack.server.log_text().count(_ANSWERED_REFUSAL)
    assert answered <= budget * (result.seconds + 2), (answered, result.seconds)
