"""After a NATS restart every agent reconnects at once: slow TokenReviews run side by side, so
none waits behind the others past nats-server's callout timeout."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from devcluster.apiserver import APIServerEmulator
from services.natsauth.tokenreview import KubeTokenReviewer
from shared.kube.client import KubeClient
from tests.integration.security.callout_stack import callout_stack, connected

pytestmark = pytest.mark.integration

REVIEW_S = 0.5
CLIENTS = 12


class SlowReviewer:
    """The real TokenReview, each answer held back as a loaded API server would."""

    def __init__(self) -> None:
        self.inner: KubeTokenReviewer | None = None

    async def review(self, token: str, *, audience: str) -> Mapping[str, Any]:
        await asyncio.sleep(REVIEW_S)
        assert self.inner is not None
        return await self.inner.review(token, audience=audience)


async def test_concurrent_connects_are_reviewed_side_by_side(
    kube: APIServerEmulator, tmp_path: Path
):
    reviewer = SlowReviewer()
    async with callout_stack(kube, tmp_path, reviewer=reviewer) as stack:
        assert stack.config is not None
        client = await KubeClient.connect(stack.config.kube)
        reviewer.inner = KubeTokenReviewer(client)
        try:
            settings = [await stack.agent_settings("dra-health", "node-a") for _ in range(CLIENTS)]
            started = time.monotonic()

            async def connect_one(index: int) -> None:
                async with connected(settings[index], component="health", node="node-a"):
                    pass

            await asyncio.gather(*(connect_one(i) for i in range(CLIENTS)))
            took = time.monotonic() - started
        finally:
            await client.close()
    # One after the other would take CLIENTS * REVIEW_S = 6 s.
    assert took < CLIENTS * REVIEW_S / 3, took
