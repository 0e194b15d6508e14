"""Node A's credentials against node B on the secured bus (auth callout, provisioned streams).

Attacks 2-5 of the compromised-node review: a rollup on one's own key, reshaping a bucket,
reading, feeding or redirecting another node's watch, and filling the bus. The attacker uses
node A's real tokens with a plain nats-py client; what is asserted is that B's records stay as
B wrote them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import nats.errors
import nats.js.errors
import pytest

from devcluster.apiserver import APIServerEmulator
from devcluster.natsserver import NATSServerProcess
from services.natsauth import migration
from shared.bus import convergence, kv, streams
from shared.bus.subjects import Names
from tests.integration.security.callout_stack import (
    DRIVER,
    OPERATOR,
    callout_stack,
    connected,
    raw_client,
)
from tests.integration.security.secure_nats import eventually

pytestmark = pytest.mark.integration

N = Names("")
A, B = "node-a", "node-b"
INVENTORY_A, INVENTORY_B = N.inventory_key(DRIVER, A), N.inventory_key(DRIVER, B)


async def test_a_rollup_on_its_own_key_purges_no_other_nodes_records(
    kube: APIServerEmulator, tmp_path: Path
):
    async with callout_stack(kube, tmp_path) as stack:
        async with connected(await stack.agent_settings("dra-health", B),
                             component="health", node=B) as health_b:  # fmt: skip
            await health_b.kv_put(N.health_bucket, N.health_key(DRIVER, B, "gpu-0"), b"b-gpu-0")
        async with connected(await stack.agent_settings("dra-discovery", B),
                             component="discovery", node=B) as discovery_b:  # fmt: skip
            await discovery_b.kv_put(N.inventory_bucket, INVENTORY_B, b"b-inventory")
        for account, subject in (
            ("dra-discovery", N.kv_subject(N.inventory_bucket, INVENTORY_A)),
            ("dra-health", N.kv_subject(N.health_bucket, N.health_key(DRIVER, A, "gpu-0"))),
        ):
            role = account.removeprefix("dra-")
            token = await stack.token(account, node=A)
            async with raw_client(stack, token, inbox=N.inbox_prefix(role, A)) as attacker:
                js = attacker.nc.jetstream(timeout=2)
                with pytest.raises(nats.js.errors.APIError, match="rollup"):
                    await js.publish(subject, b"", headers={"Nats-Rollup": "all"})
        async with connected(stack.settings(await stack.token(OPERATOR)),
                             component="operator") as admin:  # fmt: skip
            assert await admin.kv_get(N.inventory_bucket, INVENTORY_B) == b"b-inventory"
            health_b_key = N.health_key(DRIVER, B, "gpu-0")
            assert await admin.kv_get(N.health_bucket, health_b_key) == b"b-gpu-0"


async def test_a_bucket_reshaped_before_the_secured_bus_is_brought_back_by_the_provisioner(
    kube: APIServerEmulator, tmp_path: Path
):
    """An agent on an old, open bus made the inventory bucket with a transform from A's key
    to B's. The provisioner (dra-nats-auth at start) puts it back; A's puts stay A's."""
    store = tmp_path / "store"
    open_server = NATSServerProcess(store)
    open_server.start()
    try:
        nc = await nats.connect(open_server.url)
        wanted = streams.kv_stream(N.inventory_bucket, replicas=1)
        transform = {"src": N.kv_subject(N.inventory_bucket, INVENTORY_A),
                     "dest": N.kv_subject(N.inventory_bucket, INVENTORY_B)}  # fmt: skip
        body = {**wanted, "subject_transform": transform}
        reply = await nc.request(f"$JS.API.STREAM.CREATE.{wanted['name']}",
                                 json.dumps(body).encode(), timeout=5)  # fmt: skip
        assert "error" not in json.loads(reply.data)
        await nc.close()
    finally:
        open_server.stop()
    migration.adopt_global_account(store, account="DRA")
    async with callout_stack(kube, tmp_path / "stack", store_dir=store) as stack:
        async with connected(await stack.agent_settings("dra-discovery", A),
                             component="discovery", node=A) as discovery_a:  # fmt: skip
            reported = await convergence.stream_config(discovery_a.nc, str(wanted["name"]),
                                                       timeout_s=5)  # fmt: skip
            assert reported is not None
            assert "subject_transform" not in reported
            await discovery_a.kv_put(N.inventory_bucket, INVENTORY_A, b"a-inventory")
            assert await discovery_a.kv_get(N.inventory_bucket, INVENTORY_A) == b"a-inventory"
        async with connected(await stack.agent_settings("dra-discovery", B),
                             component="discovery", node=B) as discovery_b:  # fmt: skip
            assert await discovery_b.kv_get(N.inventory_bucket, INVENTORY_B) is None


async def test_another_nodes_watch_can_be_neither_taken_nor_fed(
    kube: APIServerEmulator, tmp_path: Path, bus_events: list[MutableMapping[str, Any]]
):
    async with callout_stack(kube, tmp_path) as stack:
        settings_b = await stack.agent_settings("dra-allocation", B)
        discovery_b = await stack.agent_settings("dra-discovery", B)
        async with (
            connected(discovery_b, component="discovery", node=B) as writer_b,
            connected(settings_b, component="allocation", node=B) as bus_b,
        ):
            await writer_b.kv_put(N.inventory_bucket, INVENTORY_B, b"genuine")
            seen: list[bytes | None] = []

            async def follow() -> None:
                async for change in kv.watch(bus_b, bucket=N.inventory_bucket, keys=INVENTORY_B):
                    if not change.synced:
                        seen.append(change.value)

            watching = asyncio.create_task(follow())
            try:
                await eventually(lambda: seen == [b"genuine"])
                discovery_a = await stack.agent_settings("dra-discovery", A)
                async with connected(discovery_a, component="discovery", node=A) as writer_a:
                    await writer_a.kv_put(N.inventory_bucket, INVENTORY_A, b"forged for B")
                token = await stack.token("dra-allocation", node=A)
                inbox = N.inbox_prefix("allocation", A)
                followed_b = N.kv_followed(N.inventory_bucket, INVENTORY_B)
                async with raw_client(stack, token, inbox=inbox) as attacker:
                    # B's followed copies: neither to be read nor written by A.
                    await attacker.nc.subscribe(followed_b)
                    await attacker.violation("subscription", followed_b)
                    await attacker.nc.publish(followed_b, b"forged for B")
                    await attacker.violation("publish", followed_b)
                    # A consumer on B's key, under any name: refused (node agents hold none).
                    watch_b = N.js_consumer_create(N.inventory_bucket, INVENTORY_B, consumer="w")
                    await attacker.nc.publish(watch_b, b"{}", reply=f"{inbox}.r1")
                    await attacker.violation("publish", watch_b)
                    # A's own direct get, answered by JetStream onto B's followed subject:
                    # delivered (nats-server does not check a reply subject), dropped.
                    own = N.js_direct_get(N.inventory_bucket, INVENTORY_A)
                    await attacker.nc.publish(own, b"", reply=followed_b)
                    await attacker.nc.flush()
                dropped = ("kv_entry_dropped", "not_this_watch")
                await eventually(
                    lambda: [e for e in bus_events if (e["event"], e.get("reason")) == dropped]
                )
                await writer_b.kv_put(N.inventory_bucket, INVENTORY_B, b"genuine 2")
                await eventually(lambda: seen[-1:] == [b"genuine 2"])
                assert seen == [b"genuine", b"genuine 2"]
            finally:
                watching.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watching


async def test_one_node_cannot_hoard_consumers_subscriptions_or_oversized_values(
    kube: APIServerEmulator, tmp_path: Path
):
    async with callout_stack(kube, tmp_path) as stack:
        token = await stack.token("dra-health", node=A)
        inbox = N.inbox_prefix("health", A)
        async with raw_client(stack, token, inbox=inbox) as attacker:
            # A consumer name of its own choosing (how 3,000 durables were made): refused.
            hoarded = N.js_consumer_create(
                N.health_bucket, N.health_keys(DRIVER, A), consumer="health-node-a-durable-1"
            )
            await attacker.nc.publish(hoarded, b"{}", reply=f"{inbox}.r1")
            await attacker.violation("publish", hoarded)
            # A value above the bucket's max_msg_size on its own key: refused by the stream.
            js = attacker.nc.jetstream(timeout=2)
            subject = N.kv_subject(N.health_bucket, N.health_key(DRIVER, A, "gpu-0"))
            with pytest.raises(nats.js.errors.APIError, match="maximum"):
                await js.publish(subject, b"x" * (64 * 1024))
            # Subscriptions per connection: the account's limit (nats-server 2.15 does not
            # apply the `subs` of a user JWT that came through the callout).
            with contextlib.suppress(nats.errors.Error):
                for index in range(300):
                    await attacker.nc.subscribe(f"{inbox}.s{index}")
                await attacker.nc.flush()
            await eventually(lambda: "maximum subscriptions exceeded" in stack.server.log_text())
        async with connected(stack.settings(await stack.token(OPERATOR)),
                             component="operator") as admin:  # fmt: skip
            account = await admin.js.account_info()
            assert account.limits.max_consumers == 50_000
            assert account.limits.max_streams == 16
            assert 0 < account.limits.max_storage <= 1280 * 1024 * 1024
            assert sum(c["max_bytes"] for c in streams.all_streams(N, replicas=1)) <= (
                account.limits.max_storage
            )
