"""Node A empties node B's health record and prepared claim on the secured bus; B puts each back
at once, not at its next refresh, and a flood of such attacks gets no more re-puts than B's pace.

The attacker has nats-server write onto B's key with node A's real credentials: a direct get of
a key A has no value on, its 404 answer sent to B's key as reply subject. With
`--bus-signatures enforce` every reader drops that entry; without the guard B's key would hold no
valid record until B's refresh (set to a day here, so that only the guard can restore it).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator, MutableMapping
from pathlib import Path
from typing import Any

import pytest

from devcluster.apiserver import APIServerEmulator
from services.allocation.claim.checkpoint import ClaimState, PreparedClaim, PreparedDevice
from services.allocation.claim.claims import ClaimRef, PodRef
from services.allocation.dra.claim_publisher import PreparedClaimPublisher
from services.discovery.agent import DiscoveryAgent
from services.discovery.config import DiscoveryConfig
from services.health.agent import HealthAgent
from services.health.config import HealthConfig
from shared import metrics
from shared.bus import codec, ownkeys
from shared.bus.connection import Bus
from shared.bus.subjects import Names
from shared.config import KubeSettings
from shared.pb.drasuite.v1 import claim_pb2, health_pb2
from tests.integration.security.callout_stack import (
    DRIVER,
    OPERATOR,
    CalloutStack,
    callout_stack,
    connected,
    raw_client,
)
from tests.integration.security.secure_nats import eventually, logged, running_agents

pytestmark = pytest.mark.integration

N = Names("")
A, B = "node-a", "node-b"
GPU_KEY_B = N.health_key(DRIVER, B, "gpu-0")
CLAIM_UID = "3f6c1d2e-0000-4000-8000-00000000000b"
CLAIM_KEY_B = N.claim_key(DRIVER, B, CLAIM_UID)
DAY_S = 86_400.0
# Restored "at once": far below any refresh, generous for a shared, slow machine.
RESTORE_WITHIN_S = 20.0


def _reasserted(metric: str) -> float:
    metrics.configure(service="test")
    pattern = rf'{metric}_total\{{reason="[a-z]+"\}} ([0-9.]+)'
    return sum(float(v) for v in re.findall(pattern, metrics.render().decode()))


@contextlib.asynccontextmanager
async def _attacker(stack: CalloutStack) -> AsyncIterator[Any]:
    """Node A's discovery identity, emptying any subject by a redirected 404 answer."""
    token = await stack.token("dra-discovery", node=A)
    async with raw_client(stack, token, inbox=N.inbox_prefix("discovery", A)) as client:

        async def empty(bucket: str, key: str) -> None:
            # Node A has no inventory: the server answers 404, onto B's key, and stores it.
            get = N.js_direct_get(N.inventory_bucket, N.inventory_key(DRIVER, A))
            await client.nc.publish(get, b"", reply=N.kv_subject(bucket, key))
            await client.nc.flush()
            assert not client.errors  # nothing here is a permission violation

        yield empty


@contextlib.asynccontextmanager
async def _node_b(stack: CalloutStack, kube: KubeSettings) -> AsyncIterator[None]:
    """Node B's discovery agent (its sim GPUs' inventory) and health agent (their records, a
    refresh a day apart)."""
    discovery = DiscoveryAgent(DiscoveryConfig(
        nats=await stack.agent_settings("dra-discovery", B), kube=kube, node_name=B,
        driver_name=DRIVER, sim_profile="gpu",
    ))  # fmt: skip
    health = HealthAgent(HealthConfig(
        nats=await stack.agent_settings("dra-health", B), kube=kube, node_name=B,
        driver_name=DRIVER, sim_profile="gpu", poll_interval_s=0.1, health_refresh_s=DAY_S,
    ))  # fmt: skip
    async with running_agents(discovery, health):
        yield


async def _valid_health(admin: Bus) -> health_pb2.DeviceHealth | None:
    data = await admin.kv_get(N.health_bucket, GPU_KEY_B)  # checked: None unless B signed it
    return None if data is None else codec.decode(health_pb2.DeviceHealth, data, subject="h")


async def _until(check: Any, *, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while (found := await check()) is None:
        if time.monotonic() > deadline:
            raise AssertionError(f"not restored within {timeout_s}s")
        await asyncio.sleep(0.02)
    return found


async def test_an_emptied_health_record_is_put_back_at_once(
    kube: APIServerEmulator,
    kube_settings: KubeSettings,
    tmp_path: Path,
    bus_events: list[MutableMapping[str, Any]],
):
    before = _reasserted("dra_health_records_reasserted")
    async with callout_stack(kube, tmp_path, signatures="enforce") as stack:
        operator = stack.settings(await stack.token(OPERATOR))
        async with (
            _node_b(stack, kube_settings),
            connected(operator, component="operator") as admin,
            _attacker(stack) as empty,
        ):
            written = await _until(lambda: _valid_health(admin), timeout_s=20)
            await empty(N.health_bucket, GPU_KEY_B)
            attacked_at = time.monotonic()
            # The emptied entry is there, and dropped by every reader ...
            await eventually(lambda: logged(bus_events, "kv_entry_dropped"), timeout_s=10)
            restored = await _until(lambda: _valid_health(admin), timeout_s=RESTORE_WITHIN_S)
            took_s = time.monotonic() - attacked_at
    # ... until B put its record back, long before any refresh of it.
    assert took_s < RESTORE_WITHIN_S < DAY_S / 2
    assert (restored.device, restored.state) == (written.device, written.state)
    put_back = logged(bus_events, "health_record_reasserted")
    assert [(e["key"], e["reason"], e["security"]) for e in put_back][:1] == [
        (GPU_KEY_B, "rejected", True)
    ]
    assert _reasserted("dra_health_records_reasserted") > before


async def test_an_emptied_prepared_claim_is_put_back_at_once(
    kube: APIServerEmulator, tmp_path: Path, bus_events: list[MutableMapping[str, Any]]
):
    before = _reasserted("dra_prepared_claims_reasserted")
    async with callout_stack(kube, tmp_path, signatures="enforce") as stack:
        allocation_b = await stack.agent_settings("dra-allocation", B)
        operator = stack.settings(await stack.token(OPERATOR))
        async with (
            connected(allocation_b, component="allocation", node=B) as bus_b,
            _claim_owner(bus_b) as publisher,
            connected(operator, component="operator") as admin,
            _attacker(stack) as empty,
        ):
            await asyncio.wait_for(publisher.synced.wait(), 20)
            written = await _until(lambda: _valid_claim(admin), timeout_s=20)
            await empty(N.claims_bucket, CLAIM_KEY_B)
            attacked_at = time.monotonic()
            await eventually(lambda: logged(bus_events, "kv_entry_dropped"), timeout_s=10)
            restored = await _until(lambda: _valid_claim(admin), timeout_s=RESTORE_WITHIN_S)
            took_s = time.monotonic() - attacked_at
    assert took_s < RESTORE_WITHIN_S
    assert restored == written
    put_back = logged(bus_events, "prepared_claim_reasserted")
    assert [(e["claim_uid"], e["reason"], e["security"]) for e in put_back][:1] == [
        (CLAIM_UID, "rejected", True)
    ]
    assert _reasserted("dra_prepared_claims_reasserted") > before


async def test_a_flood_of_emptying_attacks_gets_no_more_re_puts_than_the_pace(
    kube: APIServerEmulator,
    kube_settings: KubeSettings,
    tmp_path: Path,
    bus_events: list[MutableMapping[str, Any]],
):
    pace = ownkeys.ReassertPace()  # the health agent's own
    before = _reasserted("dra_health_records_reasserted")
    async with callout_stack(kube, tmp_path, signatures="enforce") as stack:
        operator = stack.settings(await stack.token(OPERATOR))
        async with (
            _node_b(stack, kube_settings),
            connected(operator, component="operator") as admin,
            _attacker(stack) as empty,
        ):
            await _until(lambda: _valid_health(admin), timeout_s=20)
            started = time.monotonic()
            attacks = 0
            while time.monotonic() - started < 4.0:
                await empty(N.health_bucket, GPU_KEY_B)
                attacks += 1
                await asyncio.sleep(0.01)
            # The last attack is put back too, after at most the pace's longest delay.
            await _until(lambda: _valid_health(admin), timeout_s=pace.backoff.max_s + 20)
            elapsed_s = time.monotonic() - started
            re_puts = _reasserted("dra_health_records_reasserted") - before
    assert 1 <= re_puts <= pace.most_in(elapsed_s)
    assert re_puts < attacks / 2, (re_puts, attacks)
    assert logged(bus_events, "bus_reasserts_throttled")


@contextlib.asynccontextmanager
async def _claim_owner(bus: Bus) -> AsyncIterator[PreparedClaimPublisher]:
    """Node B's prepared-claims writer and its guard, as the allocation agent runs them."""

    async def no_lookup(ref: ClaimRef) -> tuple[PodRef, ...]:
        return ()

    publisher = PreparedClaimPublisher(bus, driver=DRIVER, node=B, lookup=no_lookup)
    device = PreparedDevice(request_names=("gpu",), pool=B, device="gpu-0",
                            cdi_device_ids=(f"{DRIVER}/gpu=gpu-0",))  # fmt: skip
    record = PreparedClaim(uid=CLAIM_UID, namespace="team", name="train", driver=DRIVER,
                           state=ClaimState.PREPARE_COMPLETED, devices=(device,))  # fmt: skip
    publisher.prepared(record, pods=[PodRef(namespace="team", name="trainer-0", uid="pod-0")])
    tasks = [asyncio.create_task(publisher.run()), asyncio.create_task(publisher.guard())]
    try:
        yield publisher
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _valid_claim(admin: Bus) -> claim_pb2.PreparedClaim | None:
    data = await admin.kv_get(N.claims_bucket, CLAIM_KEY_B)
    return None if data is None else codec.decode(claim_pb2.PreparedClaim, data, subject="c")
