"""Attacks on the callout-secured bus, each refused by nats-server itself.

The attacker holds a real token: a node agent's (node-a) or a pod's in the cluster, and uses a
plain nats-py client, not our Bus, so nothing of ours stands between it and the server. Every
attempt must come back as the server's authorization or permission violation, and a forged
write must not land.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from devcluster.apiserver import APIServerEmulator
from shared.bus.subjects import Names
from tests.integration.security.callout_stack import (
    DRIVER,
    NAMESPACE,
    OPERATOR,
    CalloutStack,
    callout_stack,
    connected,
    raw_client,
    refused_connect,
)

pytestmark = pytest.mark.integration

N = Names("")
A, B = "node-a", "node-b"


async def _no_token(stack: CalloutStack) -> str | None:
    return None


async def _garbage(stack: CalloutStack) -> str | None:
    return "not-a-token"


async def _wrong_audience(stack: CalloutStack) -> str | None:
    return await stack.token("dra-health", node=A, audience="https://kubernetes.default.svc")


async def _expired(stack: CalloutStack) -> str | None:
    issuer = stack.kube.cluster.tokens
    issuer.clock = lambda: time.time() - 7200  # issued two hours ago for one hour
    try:
        return await stack.token("dra-health", node=A)
    finally:
        issuer.clock = time.time


async def _unknown_account(stack: CalloutStack) -> str | None:
    return await stack.token("default", node=A)


async def _not_bound_to_a_node(stack: CalloutStack) -> str | None:
    return await stack.token("dra-health")


async def _pod_deleted(stack: CalloutStack) -> str | None:
    token = await stack.token("dra-health", node=A)
    stack.kube.delete_object("pods", f"dra-health-{A}", NAMESPACE)
    return token


REFUSED_CONNECTS: dict[str, Callable[[CalloutStack], object]] = {
    "no credentials": _no_token,
    "a token that is no JWT": _garbage,
    "a token for the API server's audience": _wrong_audience,
    "an expired token": _expired,
    "a pod's token of another service account": _unknown_account,
    "an agent token bound to no node": _not_bound_to_a_node,
    "a token whose pod was deleted": _pod_deleted,
}


@pytest.mark.parametrize("make_token", REFUSED_CONNECTS.values(), ids=REFUSED_CONNECTS)
async def test_the_server_refuses_to_connect(make_token, kube: APIServerEmulator, tmp_path: Path):
    async with callout_stack(kube, tmp_path) as stack:
        token = await make_token(stack)
        error = await refused_connect(stack, token)
        assert "authorization violation" in error


def _inventory(node: str) -> str:
    return N.kv_subject(N.inventory_bucket, N.inventory_key(DRIVER, node))


def _health(node: str) -> str:
    return N.kv_subject(N.health_bucket, N.health_key(DRIVER, node, "gpu-0"))


# (who attacks, what it publishes): each must be a publish violation.
FORGED_PUBLISHES = {
    "forged inventory put for another node": ("dra-discovery", _inventory(B)),
    "inventory put by the health agent": ("dra-health", _inventory(A)),
    "forged health record for another node": ("dra-health", _health(B)),
    "health record by the discovery agent": ("dra-discovery", _health(A)),
    "forged alert for another node": ("dra-health", N.alerts(DRIVER, B)),
    "fault injection into another node": ("dra-health", N.fault_control(DRIVER, B)),
    "fault injection by a non-operator": ("dra-health", N.fault_control(DRIVER, A)),
    "drain of another node's device": ("dra-allocation", N.drain_control(DRIVER, B)),
    "drain by a non-operator": ("dra-discovery", N.drain_control(DRIVER, A)),
    "direct get of another node's inventory": (
        "dra-allocation", N.js_direct_get(N.inventory_bucket, N.inventory_key(DRIVER, B)),
    ),
    "direct get of another node's health": (
        "dra-allocation", N.js_direct_get(N.health_bucket, N.health_key(DRIVER, B, "gpu-0")),
    ),
    "watch of another node's inventory": (
        "dra-health", N.js_consumer_create(N.inventory_bucket, N.inventory_key(DRIVER, B),
                                           consumer="w1"),
    ),
    "watch of another node's health": (
        "dra-allocation", N.js_consumer_create(N.health_bucket, N.health_keys(DRIVER, B),
                                               consumer="w1"),
    ),
    "watch with the filter hidden in the body": (
        "dra-allocation", "$JS.API.CONSUMER.CREATE.KV_dra_inventory",
    ),
    "message get with the subject hidden in the body": (
        "dra-allocation", "$JS.API.STREAM.MSG.GET.KV_dra_inventory",
    ),
    "stream delete by an agent": ("dra-discovery", "$JS.API.STREAM.DELETE.KV_dra_inventory"),
    "stream purge by an agent": ("dra-health", "$JS.API.STREAM.PURGE.KV_dra_health"),
    "stream update by an agent": ("dra-health", "$JS.API.STREAM.UPDATE.DRA_ALERTS"),
    "message delete by an agent": ("dra-health", "$JS.API.STREAM.MSG.DELETE.KV_dra_health"),
    "consumer delete by an agent": ("dra-allocation", "$JS.API.CONSUMER.DELETE.KV_dra_health.x"),
    "stream create by an agent": ("dra-discovery", "$JS.API.STREAM.CREATE.KV_dra_inventory"),
    "alert stream create by the health agent": ("dra-health", "$JS.API.STREAM.CREATE.DRA_ALERTS"),
    "another node's consumer, on its own key": (
        "dra-allocation", N.js_consumer_create(N.inventory_bucket, N.inventory_key(DRIVER, A),
                                               consumer=N.consumer("allocation", B, "watch")),
    ),
    "delete of another node's consumer": (
        "dra-allocation", N.js_consumer_delete(N.inventory_bucket,
                                               N.consumer("allocation", B, "watch")),
    ),
}  # fmt: skip

ROLE = {"dra-discovery": "discovery", "dra-allocation": "allocation", "dra-health": "health"}


@pytest.mark.parametrize(("account", "subject"), FORGED_PUBLISHES.values(), ids=FORGED_PUBLISHES)
async def test_the_server_refuses_a_node_agents_publish(
    account: str, subject: str, kube: APIServerEmulator, tmp_path: Path
):
    async with callout_stack(kube, tmp_path) as stack:
        token = await stack.token(account, node=A)
        inbox = N.inbox_prefix(ROLE[account], A)
        async with raw_client(stack, token, inbox=inbox) as attacker:
            await attacker.nc.publish(subject, b"forged", reply=f"{inbox}.r1")
            await attacker.nc.flush()
            await attacker.violation("publish", subject)


SUBSCRIPTIONS = {
    "another node's control subjects": ("dra-health", N.node_control(DRIVER, B)),
    "another node's inbox": ("dra-health", f"{N.inbox_prefix('health', B)}.>"),
    "the operator's inbox": ("dra-health", f"{N.inbox_prefix('operator')}.>"),
    "another node's inventory puts": ("dra-allocation", _inventory(B)),
    "every subject": ("dra-discovery", ">"),
    "its own control subjects, by the discovery agent": (
        "dra-discovery", N.node_control(DRIVER, A),
    ),
}  # fmt: skip


@pytest.mark.parametrize(("account", "subject"), SUBSCRIPTIONS.values(), ids=SUBSCRIPTIONS)
async def test_the_server_refuses_a_node_agents_subscription(
    account: str, subject: str, kube: APIServerEmulator, tmp_path: Path
):
    async with callout_stack(kube, tmp_path) as stack:
        token = await stack.token(account, node=A)
        async with raw_client(stack, token, inbox=N.inbox_prefix(ROLE[account], A)) as attacker:
            await attacker.nc.subscribe(subject)
            await attacker.nc.flush()
            await attacker.violation("subscription", subject)


async def test_a_forged_inventory_put_for_another_node_does_not_land(
    kube: APIServerEmulator, tmp_path: Path
):
    async with callout_stack(kube, tmp_path) as stack:
        operator = stack.settings(await stack.token(OPERATOR))
        victim = await stack.agent_settings("dra-discovery", B)
        key_b = N.inventory_key(DRIVER, B)
        async with connected(victim, component="discovery", node=B) as bus_b:
            await bus_b.kv_put(N.inventory_bucket, key_b, b"genuine")
        token = await stack.token("dra-discovery", node=A)
        async with raw_client(stack, token, inbox=N.inbox_prefix("discovery", A)) as attacker:
            js = attacker.nc.jetstream(timeout=1)
            with pytest.raises(Exception):  # noqa: B017, PT011  # the ack never comes
                await js.publish(_inventory(B), b"forged")
            await attacker.violation("publish", _inventory(B))
        async with connected(operator, component="operator") as admin:
            assert await admin.kv_get(N.inventory_bucket, key_b) == b"genuine"
