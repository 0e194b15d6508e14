"""Reads the API server's version and turns it into the rules slices are published by.

`GET /version` is readable by every authenticated client (system:public-info-viewer). A
server older than 1.34 or newer than 1.37 gets the nearest supported rules, with a warning.
"""

from __future__ import annotations

import asyncio

import structlog

from services.discovery import apirules
from shared.backoff import Backoff
from shared.errors import KubeError, RecoverableError
from shared.kube.client import KubeClient

__all__ = ["detect", "detect_at_start"]

log = structlog.get_logger(__name__)


async def detect(client: KubeClient) -> apirules.PublishRules:
    """The rules of the server `client` talks to; raises what `client.get_path` raises."""
    version = await client.get_path("/version")
    minor = apirules.minor_of(version)
    rules = apirules.for_server(version)
    if minor != rules.minor:
        log.warning(
            "server_version_unsupported",
            git_version=version.get("gitVersion", ""),
            minor=minor,
            publishing_for=rules.describe(),
        )
    return rules


async def detect_at_start(client: KubeClient) -> apirules.PublishRules:
    """`detect`, retried while the server cannot be reached; the newest rules if it refuses."""
    backoff = Backoff(initial_s=0.2, max_s=5.0)
    while True:
        try:
            return await detect(client)
        except RecoverableError as exc:
            delay = backoff.next_delay()
            log.warning("server_version_unknown", error=str(exc), retry_in_s=round(delay, 2))
            await asyncio.sleep(delay)
        except KubeError as exc:
            log.warning("server_version_unreadable", error=str(exc))
            return apirules.for_minor(apirules.NEWEST)
