"""One node filling a bucket with keys under its own name, on the secured bus.

Node A's health identity (and its allocation identity, in the claims bucket) puts new keys of
the bucket's largest value as fast as it can, without waiting for acks. The auth service's
quota auditor finds A over its quota, revokes it at once (its connection ends within
`ENFORCE_BOUND_S`), puts it on the revocation list once, logs and counts it, and deletes
every key of A over the quota; node B puts new keys all along and none is refused. A node
that fills its quota exactly, and rewrites it, is never revoked.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import pytest

from devcluster.apiserver import APIServerEmulator
from services.natsauth import quota, revocations
from services.natsauth.revocationstore import CONFIGMAPS
from shared.bus import streams
from shared.bus.connection import Bus
from shared.bus.subjects import Names
from tests.integration.security.callout_stack import (
    DRIVER,
    NAMESPACE,
    OPERATOR,
    callout_stack,
    connected,
    eventually_async,
    refused_connect,
)
from tests.integration.security.quota_attack import FLOODS, flood, steady_puts
from tests.integration.security.secure_nats import eventually

pytestmark = pytest.mark.integration

N = Names("")
A, B = "node-a", "node-b"
_MARKER_BYTES = 1024
"""A delete marker's size bound: subject and headers (a signed one carries a certificate and a
signature), no value; A's values were 63.5 KiB each."""
_STORED_OVERHEAD_BYTES = 256
"""What the stream stores besides a message's headers and data (subject, sequence, time)."""
_B_RECORD_BYTES = 1024
"""One of B's small signed records (or its signed delete marker), as stored."""
ENFORCE_BOUND_S = 3.0
"""From A's first key over the quota to its connection ended, on a shared 2-core machine."""


def _events(events: list[MutableMapping[str, Any]], name: str) -> list[MutableMapping[str, Any]]:
    return [e for e in events if e.get("event") == name]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("kind", sorted(FLOODS))
async def test_a_node_flooding_its_own_keys_is_revoked_and_its_excess_deleted(
    kube: APIServerEmulator, tmp_path: Path, bus_events: list[MutableMapping[str, Any]],
    kind: str,
):  # fmt: skip
    attack = FLOODS[kind]
    bucket = attack.bucket(N)
    limit = quota.quota_of(bucket)
    assert limit is not None
    async with callout_stack(kube, tmp_path / "stack") as stack:
        assert stack.service is not None
        await asyncio.wait_for(stack.service.auditor.synced.wait(), 10)
        b_settings = await stack.agent_settings(attack.account, B)
        async with connected(
            b_settings, component=attack.account.removeprefix("dra-"), node=B
        ) as b:
            b_bucket = b.names.health_bucket if kind == "health" else b.names.claims_bucket
            async with steady_puts(b, b_bucket) as steady:
                result = await flood(
                    stack, attack, A, value_size=streams.limits_of(bucket).max_msg_size - 512
                )
                await asyncio.sleep(0.5)  # B goes on after the attack, too
            assert steady.failed == []
            assert steady.done > 10

        # A was cut off soon after its first key over the quota, and stays out.
        assert result.enforce_s is not None, result
        assert result.enforce_s < ENFORCE_BOUND_S, result
        assert result.sent > limit.keys
        token = await stack.token(attack.account, node=A)
        assert "authorization violation" in await refused_connect(stack, token)
        # One replica acted: one log line, one list entry (no end), the reason for the operator.
        exceeded = await eventually(lambda: _events(bus_events, "bus_quota_exceeded"))
        assert len(exceeded) == 1
        assert exceeded[0]["security"] is True
        assert exceeded[0]["node"] == A
        assert exceeded[0]["bucket"] == bucket
        assert exceeded[0]["over"] == "keys"
        assert exceeded[0]["quota_keys"] == limit.keys
        listed = kube.get_object(CONFIGMAPS.plural, revocations.CONFIGMAP, NAMESPACE)
        assert listed is not None
        entry = revocations.parse(listed["data"])[A]
        assert entry.until is None
        assert entry.reason.startswith(f"bus quota: {bucket} keys")
        # Its keys over the quota were deleted (a marker each, which expires); those within it
        # stay, and the bucket holds about its quota's bytes.
        async with connected(stack.settings(await stack.token(OPERATOR)),
                             component="operator") as operator:  # fmt: skip

            def junk(index: int) -> str:
                return Names.health_key(DRIVER, A, f"junk{index}")

            for index in (limit.keys, limit.keys + 1, result.sent - 1):
                await eventually_async(functools.partial(_gone, operator, bucket, junk(index)))
            assert await operator.kv_get(bucket, junk(0)) is not None
            assert await operator.kv_get(bucket, junk(limit.keys - 1)) is not None
            # A's records within its quota (each with its stored overhead), a delete marker for
            # each key it sent, and B's steady traffic (a record and a marker per put).
            bound = (
                limit.bytes
                + limit.keys * _STORED_OVERHEAD_BYTES
                + result.sent * _MARKER_BYTES
                + steady.done * 2 * _B_RECORD_BYTES
            )
            # The stream's bytes fall as the server removes what the markers replace: on a
            # loaded machine that can take longer than the deletes themselves.
            await eventually_async(
                functools.partial(_bytes_within, operator, bucket, bound), timeout_s=60
            )


async def _bytes_within(bus: Bus, bucket: str, bound: int) -> bool:
    info = await bus.js.stream_info(bus.names.kv_stream(bucket))
    return info.state.bytes <= bound


async def _gone(bus: Bus, bucket: str, key: str) -> bool:
    return await bus.kv_get(bucket, key) is None


async def test_a_node_at_its_full_quota_is_never_revoked(
    kube: APIServerEmulator, tmp_path: Path, bus_events: list[MutableMapping[str, Any]]
):
    bucket = N.health_bucket
    limit = quota.quota_of(bucket)
    assert limit is not None
    value = b"x" * (limit.bytes // limit.keys - 1024)  # a signed record's headers fit too
    async with callout_stack(kube, tmp_path / "stack") as stack:
        assert stack.service is not None
        await asyncio.wait_for(stack.service.auditor.synced.wait(), 10)
        settings = await stack.agent_settings("dra-health", B)
        async with connected(settings, component="health", node=B) as b:
            for _rewrite in range(2):  # fill it, then replace every value
                await asyncio.gather(*(
                    b.kv_put(bucket, Names.health_key(DRIVER, B, f"dev{i}"), value)
                    for i in range(limit.keys)
                ))  # fmt: skip
            ledger = stack.service.auditor.ledger
            full = (limit.keys, limit.keys * len(value))
            await eventually(lambda: ledger.held(bucket, Names.inventory_key(DRIVER, B)) == full)
            await asyncio.sleep(1.0)  # a revocation would have come by now
            assert b.connected.is_set()
            await b.kv_put(bucket, Names.health_key(DRIVER, B, "dev0"), b"still mine")
        assert _events(bus_events, "bus_quota_exceeded") == []
        assert _events(bus_events, "nats_node_revoked") == []
