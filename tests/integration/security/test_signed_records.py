"""Issue 21 on the secured bus: values that prove their writer, against node A's credentials.

nats-server stores whatever JetStream answers to a reply subject, so node A can have the server
write onto node B's keys: the answer to a direct get of a key A does not have (404) or one sent
with `Nats-Required-Api-Level: 999` (412) becomes an entry with no headers and no data on B's
key; the answer to a direct get of a value A wrote for itself (naming node B, generation
2^63-1) becomes a copy of it. With `--bus-signatures enforce` (or accept) B's readers drop each
(logged with `security=true`, counted), B's discovery agent puts its inventory back at once,
and B's next inventory is taken. A's alerts naming node B, and A's claim on the message ID of an
alert B will raise, change nothing of what the operator reads. And the rolling upgrade: off,
then accept (the owner signs what it wrote unsigned), then enforce.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, MutableMapping
from pathlib import Path
from typing import Any

import pytest

from devcluster.apiserver import APIServerEmulator
from services.discovery.agent import DiscoveryAgent
from services.discovery.config import DiscoveryConfig
from services.dractl import fleet, queries
from services.health import alerts as health_alerts
from shared import metrics
from shared.bus import codec, kv
from shared.bus.connection import Bus
from shared.bus.subjects import Names
from shared.config import KubeSettings
from shared.errors import MalformedMessageError
from shared.pb.drasuite.v1 import alert_pb2, inventory_pb2
from tests.integration.security.callout_stack import (
    DRIVER,
    OPERATOR,
    CalloutStack,
    callout_stack,
    connected,
    eventually_async,
    raw_client,
)
from tests.integration.security.secure_nats import eventually, running_agents

pytestmark = pytest.mark.integration

N = Names("")
A, B = "node-a", "node-b"
INVENTORY_A, INVENTORY_B = N.inventory_key(DRIVER, A), N.inventory_key(DRIVER, B)


def _rejected(reason: str) -> float:
    metrics.configure(service="test")
    pattern = rf'dra_bus_records_rejected_total\{{reason="{reason}"\}} ([0-9.]+)'
    found = re.search(pattern, metrics.render().decode())
    return float(found.group(1)) if found else 0.0


@contextlib.asynccontextmanager
async def _discovery(stack: CalloutStack, kube: KubeSettings, node: str) -> AsyncIterator[None]:
    """The real discovery agent of `node` (sim GPUs), publishing and guarding its inventory."""
    agent = DiscoveryAgent(DiscoveryConfig(
        nats=await stack.agent_settings("dra-discovery", node), kube=kube, node_name=node,
        driver_name=DRIVER, sim_profile="gpu",
    ))  # fmt: skip
    async with running_agents(agent):
        yield


@contextlib.asynccontextmanager
async def _reader(stack: CalloutStack, node: str) -> AsyncIterator[list[kv.KVChange]]:
    """Node `node`'s allocation agent's view of its inventory key: every change it takes."""
    seen: list[kv.KVChange] = []
    settings = await stack.agent_settings("dra-allocation", node)
    async with connected(settings, component="allocation", node=node) as bus:

        async def follow() -> None:
            key = N.inventory_key(DRIVER, node)
            async for change in kv.watch(bus, bucket=N.inventory_bucket, keys=key):
                if not change.synced:
                    seen.append(change)

        task = asyncio.create_task(follow())
        try:
            yield seen
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def _generations(seen: list[kv.KVChange]) -> list[int]:
    return [
        codec.decode(inventory_pb2.Inventory, c.value, subject=c.key).generation
        for c in seen
        if c.value is not None
    ]


async def _redirect_to(stack: CalloutStack, target: str, *, headers: dict[str, str]) -> None:
    """As discovery@node-a: a direct get of its own key, the answer sent to `target`."""
    token = await stack.token("dra-discovery", node=A)
    async with raw_client(stack, token, inbox=N.inbox_prefix("discovery", A)) as attacker:
        get = N.js_direct_get(N.inventory_bucket, INVENTORY_A)
        await attacker.nc.publish(get, b"", reply=target, headers=headers or None)
        await attacker.nc.flush()
        assert not attacker.errors  # nothing here is a permission violation


async def _copy_forged_inventory_onto_b(stack: CalloutStack) -> None:
    """Node A signs, as itself, an inventory naming node B with the last generation, on its
    own key (what its grants allow), and has the server copy it onto B's key."""
    forged = inventory_pb2.Inventory(driver=DRIVER, node=B, generation=2**63 - 1)
    forged.devices.add(name="gpu-0")
    settings_a = await stack.agent_settings("dra-discovery", A)
    async with connected(settings_a, component="discovery", node=A) as discovery_a:
        await discovery_a.kv_put(N.inventory_bucket, INVENTORY_A, codec.encode(forged))
    await _redirect_to(stack, N.kv_subject(N.inventory_bucket, INVENTORY_B), headers={})


@pytest.mark.parametrize(
    ("answer", "mode"),
    [({}, "enforce"), ({"Nats-Required-Api-Level": "999"}, "accept")],
    ids=["404 enforce", "412 accept"],
)
async def test_an_emptied_key_is_dropped_by_its_readers_and_put_back_by_its_owner(
    answer: dict[str, str],
    mode: str,
    kube: APIServerEmulator,
    kube_settings: KubeSettings,
    tmp_path: Path,
    bus_events: list[MutableMapping[str, Any]],
):
    before = _rejected("empty")
    async with (
        callout_stack(kube, tmp_path, signatures=mode) as stack,
        _discovery(stack, kube_settings, B),
        _reader(stack, B) as seen,
    ):
        await eventually(lambda: _generations(seen), timeout_s=15)
        first = _generations(seen)[-1]
        # Node A has no inventory: the server answers 404 (or 412) onto B's key, and stores it.
        await _redirect_to(stack, N.kv_subject(N.inventory_bucket, INVENTORY_B), headers=answer)
        put_back = ("inventory_reasserted", "rejected")
        await eventually(
            lambda: [e for e in bus_events if (e.get("event"), e.get("reason")) == put_back],
            timeout_s=15,
        )
        await eventually(lambda: _generations(seen)[-1] > first, timeout_s=15)
        async with connected(stack.settings(await stack.token(OPERATOR)),
                             component="operator") as admin:  # fmt: skip
            shown = await queries.inventory(admin, driver=DRIVER, node=B)
            assert shown.node == B
            assert shown.generation == _generations(seen)[-1]
    # B's reader never took the emptied entry: every change it saw is a signed inventory.
    assert all(c.value is not None and c.signed for c in seen)
    dropped = [e for e in bus_events if e.get("event") == "kv_entry_dropped"]
    assert {(e["reason"], e["security"]) for e in dropped} == {("empty", True)}
    assert _rejected("empty") > before


async def test_a_forged_generation_from_another_node_never_sticks(
    kube: APIServerEmulator,
    kube_settings: KubeSettings,
    tmp_path: Path,
    bus_events: list[MutableMapping[str, Any]],
):
    async with (
        callout_stack(kube, tmp_path, signatures="enforce") as stack,
        _discovery(stack, kube_settings, B),
        _reader(stack, B) as seen,
    ):
        await eventually(lambda: _generations(seen), timeout_s=15)
        first = _generations(seen)[-1]
        await _copy_forged_inventory_onto_b(stack)
        await eventually(
            lambda: [e for e in bus_events if e.get("event") == "inventory_reasserted"],
            timeout_s=15,
        )
        await eventually(lambda: _generations(seen)[-1] > first, timeout_s=15)
        async with connected(stack.settings(await stack.token(OPERATOR)),
                             component="operator") as admin:  # fmt: skip
            assert (await queries.inventory(admin, driver=DRIVER, node=B)).generation < 2**20
    generations = _generations(seen)
    assert max(generations) < 2**20  # the forged one was never taken
    assert generations == sorted(generations)
    assert all(c.signed for c in seen)
    dropped = [e for e in bus_events if e.get("event") == "kv_entry_dropped"]
    assert dropped
    assert all(e["security"] for e in dropped)


async def test_a_rollout_through_accept_leaves_nothing_unsigned_for_enforce(
    kube: APIServerEmulator,
    kube_settings: KubeSettings,
    tmp_path: Path,
    bus_events: list[MutableMapping[str, Any]],
):
    """The upgrade order of docs/security.md: agents that wrote unsigned (off) restart in
    accept and sign what they wrote; readers in enforce then find every record signed."""
    async with callout_stack(kube, tmp_path, signatures="off") as stack:
        async with _discovery(stack, kube_settings, B), _reader(stack, B) as seen:
            await eventually(lambda: _generations(seen), timeout_s=15)
            assert not any(c.signed for c in seen)
        stack.signatures = "accept"
        async with _discovery(stack, kube_settings, B), _reader(stack, B) as seen:
            await eventually(lambda: any(c.signed for c in seen), timeout_s=15)
        stack.signatures = "enforce"
        async with _reader(stack, B) as seen:
            await eventually(lambda: _generations(seen), timeout_s=15)
            assert all(c.signed for c in seen)
    put_back = [e for e in bus_events if e.get("event") == "inventory_reasserted"]
    assert [e["reason"] for e in put_back] == ["rejected"]  # signed once, at the accept start
    assert not [e for e in bus_events if e.get("event") == "kv_entry_dropped"]


def _alert(node: str, *, since_ms: int) -> alert_pb2.Alert:
    alert_id = health_alerts.alert_id(
        driver=DRIVER, node=node, device="gpu-0", cause="xid", since_ms=since_ms,
        status=alert_pb2.ALERT_STATUS_RAISED,
    )  # fmt: skip
    return alert_pb2.Alert(
        schema_version=1, id=alert_id, status=alert_pb2.ALERT_STATUS_RAISED, driver=DRIVER,
        node=node, pool=node, device="gpu-0", cause="xid", raised_unix_ms=since_ms,
    )  # fmt: skip


async def test_alerts_name_their_signers_node_and_their_ids_cannot_be_claimed(
    kube: APIServerEmulator, tmp_path: Path
):
    async with callout_stack(kube, tmp_path, signatures="enforce") as stack:
        future = _alert(B, since_ms=1_700_000_000_000)  # an alert B will raise: its ID is public
        spoofed = codec.encode_json(future)
        token = await stack.token("dra-health", node=A)
        async with raw_client(stack, token, inbox=N.inbox_prefix("health", A)) as attacker:
            js = attacker.nc.jetstream(timeout=2)
            # Unsigned, on A's own subject, claiming the message ID of B's alert.
            await js.publish(N.alerts(DRIVER, A), spoofed, headers={"Nats-Msg-Id": future.id})
        settings_a = await stack.agent_settings("dra-health", A)
        async with connected(settings_a, component="health", node=A) as health_a:
            # Signed by node A, naming node B.
            await health_a.publish_js(N.alerts(DRIVER, A), spoofed, msg_id=future.id)
        settings_b = await stack.agent_settings("dra-health", B)
        async with connected(settings_b, component="health", node=B) as health_b:
            publisher = health_alerts.AlertPublisher(
                health_b, driver=DRIVER, node=B, max_age_s=3600, queue_size=10
            )
            publisher.publish(future)
            runner = asyncio.create_task(publisher.run())
            try:
                await eventually(lambda: publisher.published == 1, timeout_s=10)
            finally:
                runner.cancel()
                await asyncio.gather(runner, return_exceptions=True)
        skipped: list[MalformedMessageError] = []
        async with connected(stack.settings(await stack.token(OPERATOR)),
                             component="operator") as admin:  # fmt: skip
            shown = await eventually_async(lambda: _alerts(admin, skipped))
            stream = await admin.js.stream_info(N.alerts_stream)
    assert stream.state.messages == 3  # B's alert was not taken for a duplicate
    assert [(a.node, a.id) for a in shown] == [(B, future.id)]
    reasons = sorted(str(exc) for exc in skipped)
    assert any(r.endswith(": unsigned") for r in reasons), reasons
    assert any("signed by 'node-a'" in r for r in reasons), reasons


async def _alerts(admin: Bus, skipped: list[MalformedMessageError]) -> list[alert_pb2.Alert]:
    skipped.clear()
    found = [a async for a in queries.alerts(admin, follow=False, last=10, skipped=skipped.append)]
    return found if len(found) + len(skipped) >= 3 else []


async def test_dractl_across_nodes_shows_no_value_its_keys_owner_did_not_sign(
    kube: APIServerEmulator, tmp_path: Path
):
    async with callout_stack(kube, tmp_path, signatures="enforce") as stack:
        await _copy_forged_inventory_onto_b(stack)  # B runs no agent to put its own back
        async with connected(stack.settings(await stack.token(OPERATOR)),
                             component="operator") as admin:  # fmt: skip
            for _ in range(100):  # until the server stored the copy on B's key
                skipped: list[MalformedMessageError] = []
                shown = await fleet.inventories(admin, driver=DRIVER, skipped=skipped.append)
                if len(skipped) == 2:
                    break
                await asyncio.sleep(0.1)
    assert shown == []
    reasons = sorted(str(exc) for exc in skipped)
    assert any(INVENTORY_B in r and "not signed by its owner" in r for r in reasons), reasons
    assert any(INVENTORY_A in r and "node-b" in r for r in reasons), reasons  # key vs content
