"""What nats-server cannot refuse, and what the Bus does about it: redirected JetStream replies.

A node agent may direct-get its own key. The reply subject of that request is the agent's to
choose, and nats-server does not check reply subjects against permissions, so the server
itself publishes the answer (the agent's own, forged, value) wherever the agent says: into
another node's KV key or onto another node's control subject. Such a message carries the
direct get's `Nats-Stream`/`Nats-Subject` headers; the Bus's KV watch and its control
subscriptions drop it and log it with `security`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

import pytest
from nats.aio.msg import Msg

from devcluster.apiserver import APIServerEmulator
from shared.bus import kv
from shared.bus.subjects import Names
from tests.integration.security.callout_stack import (
    DRIVER,
    CalloutStack,
    callout_stack,
    connected,
    raw_client,
)
from tests.integration.security.secure_nats import eventually

pytestmark = pytest.mark.integration

N = Names("")
A, B = "node-a", "node-b"


async def _redirect_publish_ack(stack: CalloutStack, reply: str) -> None:
    """As health@node-a: put its own key with `reply` as the reply subject, so JetStream's
    publish ack (`{"stream":...,"seq":...}`) is published there."""
    token = await stack.token("dra-health", node=A)
    async with raw_client(stack, token, inbox=N.inbox_prefix("health", A)) as attacker:
        own = N.kv_subject(N.health_bucket, N.health_key(DRIVER, A, "gpu-0"))
        await attacker.nc.publish(own, b"anything", reply=reply)
        await attacker.nc.flush()
        assert not attacker.errors


async def _redirect_own_value(stack: CalloutStack, reply: str) -> None:
    """As health@node-a: put a forged value under its own key, then have the server's direct
    get deliver it to `reply`."""
    token = await stack.token("dra-health", node=A)
    async with raw_client(stack, token, inbox=N.inbox_prefix("health", A)) as attacker:
        own = N.health_key(DRIVER, A, "gpu-0")
        await attacker.nc.jetstream(timeout=2).publish(
            N.kv_subject(N.health_bucket, own), b"forged"
        )
        await attacker.nc.publish(N.js_direct_get(N.health_bucket, own), b"", reply=reply)
        await attacker.nc.flush()
        assert not attacker.errors  # nothing here is a permission violation


@pytest.mark.parametrize(
    "redirect", [_redirect_own_value, _redirect_publish_ack], ids=["direct get", "publish ack"]
)
async def test_a_redirected_reply_into_another_nodes_key_is_dropped_by_its_watch(
    redirect: Callable[[CalloutStack, str], Awaitable[None]],
    kube: APIServerEmulator,
    tmp_path: Path,
    bus_events: list[MutableMapping[str, Any]],
):
    async with callout_stack(kube, tmp_path) as stack:
        victim = await stack.agent_settings("dra-allocation", B)
        writer = await stack.agent_settings("dra-health", B)
        seen: list[kv.KVChange] = []
        async with (
            connected(victim, component="allocation", node=B) as bus,
            connected(writer, component="health", node=B) as health_b,
        ):
            key_b = N.health_key(DRIVER, B, "gpu-0")
            await health_b.kv_put(N.health_bucket, key_b, b"genuine")

            async def watch() -> None:
                async for change in kv.watch(
                    bus, bucket=N.health_bucket, keys=N.health_keys(DRIVER, B)
                ):
                    seen.append(change)

            watcher = asyncio.create_task(watch())
            try:
                await eventually(lambda: any(c.value == b"genuine" for c in seen))
                await redirect(stack, N.kv_subject(N.health_bucket, key_b))
                await eventually(
                    lambda: [e for e in bus_events if e.get("event") == "kv_entry_dropped"]
                )
            finally:
                watcher.cancel()
                await asyncio.gather(watcher, return_exceptions=True)
        assert [c.value for c in seen if c.value is not None] == [b"genuine"]


async def test_a_redirected_direct_get_onto_another_nodes_control_subject_is_dropped(
    kube: APIServerEmulator, tmp_path: Path, bus_events: list[MutableMapping[str, Any]]
):
    async with callout_stack(kube, tmp_path) as stack:
        victim = await stack.agent_settings("dra-health", B)
        handled: list[Msg] = []

        async def handler(msg: Msg) -> None:
            handled.append(msg)

        async with connected(victim, component="health", node=B) as bus:
            await bus.kv(N.health_bucket)  # the bucket exists, as on any running cluster
            await bus.subscribe(N.fault_control(DRIVER, B), handler)
            await bus.nc.flush()
            await _redirect_own_value(stack, N.fault_control(DRIVER, B))
            await eventually(
                lambda: [e for e in bus_events if e.get("event") == "bus_message_dropped"]
            )
        assert not handled
