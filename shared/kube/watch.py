"""List-then-watch that never gives up: the current objects, then every change, forever.

Yields a `Snapshot` after each (re)list and `WatchEvent`s in between. A 410 Gone relists; a
transient failure backs off with jitter; a cleanly ended watch resumes from the last version.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import structlog

from shared.backoff import Backoff
from shared.errors import KubeExpiredError, KubeTransientError
from shared.kube.client import KubeClient, WatchEvent
from shared.kube.resources import ResourceType

__all__ = ["Snapshot", "reflect"]

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Every matching object as of `resource_version`."""

    items: list[dict[str, Any]]
    resource_version: str


async def reflect(
    client: KubeClient,
    rt: ResourceType,
    *,
    field_selector: str = "",
    label_selector: str = "",
    watch_timeout_s: int = 300,
) -> AsyncIterator[Snapshot | WatchEvent]:
    backoff = Backoff(initial_s=0.2, max_s=10.0)
    resource_version = ""
    while True:
        try:
            if not resource_version:
                listed = await client.list(
                    rt, field_selector=field_selector, label_selector=label_selector
                )
                resource_version = listed["metadata"]["resourceVersion"]
                yield Snapshot(items=listed.get("items", []), resource_version=resource_version)
            async for event in client.watch(
                rt,
                resource_version=resource_version,
                field_selector=field_selector,
                label_selector=label_selector,
                timeout_s=watch_timeout_s,
            ):
                resource_version = event.object.get("metadata", {}).get(
                    "resourceVersion", resource_version
                )
                backoff.reset()
                if event.type != "BOOKMARK":
                    yield event
        except KubeExpiredError:
            log.info("watch_expired", resource=rt.plural)
            resource_version = ""
        except KubeTransientError as exc:
            delay = backoff.next_delay(at_least_s=exc.retry_after_s or 0.0)
            log.warning(
                "watch_failed", resource=rt.plural, error=str(exc), retry_in_s=round(delay, 2)
            )
            await asyncio.sleep(delay)
