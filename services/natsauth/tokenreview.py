"""Asking the API server who a token belongs to: `TokenReview` through `shared.kube`.

The review names the audience we accept, so a token minted for another audience (the API
server's own, or another service's) is answered `authenticated: false`. A failed API call is
a `KubeError`; the caller refuses the client and the client retries.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from shared.kube.client import KubeClient
from shared.kube.resources import ResourceType

__all__ = ["TOKEN_REVIEWS", "KubeTokenReviewer", "TokenReviewer"]

TOKEN_REVIEWS = ResourceType("authentication.k8s.io", "v1", "tokenreviews", "TokenReview", False)


class TokenReviewer(Protocol):
    async def review(self, token: str, *, audience: str) -> Mapping[str, Any]:
        """The TokenReview `status` for `token` checked against `audience`."""
        ...


class KubeTokenReviewer:
    def __init__(self, kube: KubeClient) -> None:
        self._kube = kube

    async def review(self, token: str, *, audience: str) -> Mapping[str, Any]:
        body = {
            "apiVersion": TOKEN_REVIEWS.api_version,
            "kind": TOKEN_REVIEWS.kind,
            "metadata": {},
            "spec": {"token": token, "audiences": [audience]},
        }
        answer = await self._kube.create(TOKEN_REVIEWS, body)
        status = answer.get("status")
        return status if isinstance(status, dict) else {}
