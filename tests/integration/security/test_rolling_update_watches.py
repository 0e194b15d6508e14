"""Two processes of one agent on one node (a rolling update with surge runs the new pod beside
the old one) watch the same keys on the secured bus, and neither can cut the other's watch.

A node agent's watch holds no consumer (`shared.bus.kvfollow`): each process subscribes to its
keys' republished copies, so there is nothing for the two to share or take.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, MutableMapping
from pathlib import Path
from typing import Any

import pytest

from devcluster.apiserver import APIServerEmulator
from shared.bus import kv
from shared.bus.connection import Bus
from shared.bus.subjects import Names
from tests.integration.security.callout_stack import OPERATOR, callout_stack, connected
from tests.integration.security.secure_nats import eventually

pytestmark = pytest.mark.integration

N = Names("")
B = "node-b"
KEY = N.inventory_key("sim.dra-suite.io", B)


@contextlib.asynccontextmanager
async def _following(bus: Bus) -> AsyncIterator[list[bytes | None]]:
    seen: list[bytes | None] = []

    async def follow() -> None:
        async for change in kv.watch(bus, bucket=N.inventory_bucket, keys=KEY):
            if not change.synced:
                seen.append(change.value)

    task = asyncio.create_task(follow())
    try:
        yield seen
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_old_and_new_pod_of_a_rolling_update_each_keep_their_watch(
    kube: APIServerEmulator, tmp_path: Path, bus_events: list[MutableMapping[str, Any]]
):
    async with callout_stack(kube, tmp_path) as stack:
        writer = await stack.agent_settings("dra-discovery", B)
        allocation = await stack.agent_settings("dra-allocation", B)
        async with (
            connected(writer, component="discovery", node=B) as discovery,
            connected(allocation, component="allocation", node=B) as old_pod,
            connected(allocation, component="allocation", node=B) as new_pod,
        ):
            await discovery.kv_put(N.inventory_bucket, KEY, b"v1")
            async with _following(old_pod) as old_seen:
                await eventually(lambda: old_seen == [b"v1"])
                async with _following(new_pod) as new_seen:
                    await eventually(lambda: new_seen == [b"v1"])
                    await discovery.kv_put(N.inventory_bucket, KEY, b"v2")
                    await eventually(lambda: old_seen[-1:] == new_seen[-1:] == [b"v2"])
                    operator = stack.settings(await stack.token(OPERATOR))
                    async with connected(operator, component="operator") as admin:
                        stream = N.kv_stream(N.inventory_bucket)
                        consumers = await admin.js.consumers_info(stream)
        assert old_seen == new_seen == [b"v1", b"v2"]
        assert [c.name for c in consumers if not c.name.startswith("auditor-")] == []
        assert not [e for e in bus_events if e["event"] == "kv_watch_failed"]
        # The old pod gone, a restart of the new one replays the current value.
        async with (
            connected(allocation, component="allocation", node=B) as restarted,
            _following(restarted) as seen,
        ):
            await eventually(lambda: seen == [b"v2"])
