"""Per-node quotas: the numbers against the provisioned buckets, the ledger's counting, the
auditor's grants, and the enforcer acting once per node."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import pytest
import structlog

from services.natsauth import permissions, quota
from services.natsauth.identity import Identity
from services.natsauth.quotaenforcer import QuotaEnforcer
from services.natsauth.quotaledger import Excess, QuotaLedger
from services.natsauth.revocations import Revocation
from services.natsauth.revoker import Revoker
from services.natsauth.syskick import Connection
from shared.bus import streams
from shared.bus.subjects import Names

N = Names("")
DRIVER = "sim_dra-suite_io"
HEALTH = N.health_bucket


def _key(node: str, name: str) -> str:
    return f"{DRIVER}.{node}.{name}"


@pytest.mark.parametrize("bucket", N.buckets)
def test_a_quota_is_its_keys_times_the_provisioned_max_value_size(bucket: str):
    limit = quota.quota_of(bucket)
    assert limit is not None
    provisioned = streams.kv_stream(bucket, replicas=1)
    assert limit.bytes == limit.keys * provisioned["max_msg_size"]
    # One node at its full quota holds a small share of what the bucket may hold.
    assert limit.bytes * 8 <= provisioned["max_bytes"]
    assert quota.share_of_bucket(bucket) == limit.bytes / provisioned["max_bytes"]


def test_the_quotas_cover_a_full_node_and_name_prefixed_buckets():
    assert quota.quota_of(N.inventory_bucket) == quota.NodeQuota(keys=1, bytes=1 << 20)
    health = quota.quota_of(HEALTH)
    assert health is not None
    assert health.keys >= quota.MAX_DEVICES_PER_NODE * 2
    claims = quota.quota_of(N.claims_bucket)
    assert claims is not None
    assert claims.keys >= quota.MAX_PREPARED_CLAIMS_PER_NODE * 2
    assert quota.quota_of(Names("t1").claims_bucket) == claims
    assert quota.quota_of("KV_other") is None


def test_a_node_at_its_quota_is_counted_and_the_next_key_is_excess():
    ledger = QuotaLedger()
    limit = quota.quota_of(HEALTH)
    assert limit is not None
    for index in range(limit.keys):
        assert ledger.observe(HEALTH, _key("node-a", f"d{index}"), 100, index + 1) is None
    # Rewriting a key it holds is no new key; another node has its own quota.
    assert ledger.observe(HEALTH, _key("node-a", "d0"), 200, 1000) is None
    assert ledger.observe(HEALTH, _key("node-b", "d0"), 100, 1001) is None
    excess = ledger.observe(HEALTH, _key("node-a", "extra"), 100, 1002)
    assert excess == Excess(
        bucket=HEALTH, node="node-a", key=_key("node-a", "extra"), revision=1002, over="keys",
        keys=limit.keys, bytes=limit.keys * 100 + 100, quota=limit,
    )  # fmt: skip
    assert ledger.held(HEALTH, f"{DRIVER}.node-a") == (limit.keys, limit.keys * 100 + 100)
    # A delete gives the room back.
    assert ledger.observe(HEALTH, _key("node-a", "d1"), None, 1003) is None
    assert ledger.observe(HEALTH, _key("node-a", "extra"), 100, 1004) is None


def test_bytes_over_the_quota_are_excess_and_the_key_leaves_the_count():
    ledger = QuotaLedger()
    limit = quota.quota_of(HEALTH)
    assert limit is not None
    assert ledger.observe(HEALTH, _key("node-b", "d"), 10, 1) is None
    per_key = limit.bytes // 2
    assert ledger.observe(HEALTH, _key("node-a", "a"), per_key, 1) is None
    assert ledger.observe(HEALTH, _key("node-a", "b"), per_key, 2) is None
    excess = ledger.observe(HEALTH, _key("node-a", "b"), per_key + 1, 3)
    assert excess is not None
    assert excess.over == "bytes"
    assert ledger.held(HEALTH, f"{DRIVER}.node-a") == (1, per_key)
    assert ledger.held(HEALTH, f"{DRIVER}.node-b") == (1, 10)


def test_empty_values_foreign_keys_and_node_tokens():
    ledger = QuotaLedger()
    # An empty entry proves nothing about the key's owner (a redirected 404 leaves one).
    assert ledger.observe(HEALTH, _key("node-a", "d"), 0, 1) is None
    assert ledger.held(HEALTH, f"{DRIVER}.node-a") == (0, 0)
    # Keys no node may write are not counted; the inventory's key has two tokens.
    assert ledger.observe(HEALTH, f"{DRIVER}.node-a", 10, 2) is None
    assert ledger.observe(N.inventory_bucket, f"{DRIVER}.node-a", 10, 3) is None
    assert ledger.observe(N.inventory_bucket, f"{DRIVER}.node-a", 20, 4) is None
    assert ledger.held(N.inventory_bucket, f"{DRIVER}.node-a") == (1, 20)
    assert len(ledger) == 1
    # A node's name comes back from its subject token (dots were mapped to `_`).
    limit = quota.quota_of(N.inventory_bucket)
    assert limit is not None
    excess = ledger.observe(N.inventory_bucket, f"{DRIVER}.n1_example_com", limit.bytes + 1, 5)
    assert excess is not None
    assert excess.node == "n1.example.com"
    ledger.forget(N.inventory_bucket)
    assert len(ledger) == 0


def test_the_auditor_may_watch_through_its_own_consumers_and_delete_nothing_else():
    grants = permissions.for_identity(
        Identity(role=permissions.AUDITOR, node="1a2b3c4d"), drivers=["sim.dra-suite.io"],
        names=N,
    )  # fmt: skip
    name = "auditor-1a2b3c4d-watch"
    wanted = {"$KV.dra_health.>", "$KV.dra_claims.>"}
    for bucket in N.buckets:
        wanted |= {
            f"$JS.API.STREAM.INFO.KV_{bucket}",
            f"$JS.API.CONSUMER.CREATE.KV_{bucket}.{name}.$KV.{bucket}.>",
            f"$JS.API.CONSUMER.DELETE.KV_{bucket}.{name}",
            f"$JS.API.CONSUMER.INFO.KV_{bucket}.{name}",
        }
    assert set(grants.publish) == wanted
    assert grants.subscribe == ("_INBOX.auditor.1a2b3c4d.>",)
    assert grants.deny_publish == permissions.DENIED
    assert not grants.allow_responses


class _Seams:
    def __init__(self, *, written: bool) -> None:
        self.written = written
        self.persisted: list[str] = []
        self.kicked: list[str] = []

    async def read(self) -> Mapping[str, Revocation]:
        return {}

    async def kick(self, node: str) -> list[Connection]:
        self.kicked.append(node)
        return []

    async def persist(self, revocation: Revocation, now: float) -> bool:
        self.persisted.append(revocation.node)
        return self.written


def _excess(node: str = "node-a") -> Excess:
    limit = quota.quota_of(HEALTH)
    assert limit is not None
    return Excess(bucket=HEALTH, node=node, key=_key(node, "x"), revision=9, over="keys",
                  keys=limit.keys, bytes=0, quota=limit)  # fmt: skip


@pytest.mark.parametrize("written", [True, False])
async def test_the_enforcer_revokes_at_once_and_only_the_writer_of_the_list_reports(
    written: bool,
):
    seams = _Seams(written=written)
    revoker = Revoker(read=seams.read, kick=seams.kick, forget=lambda node: None, poll_s=1)
    enforcer = QuotaEnforcer(revoker=revoker, persist=seams.persist)
    with structlog.testing.capture_logs() as events:
        for _ in range(3):  # every further excess entry of the node is one more call
            enforcer.exceeded(_excess())
        await asyncio.sleep(0.01)
    await enforcer.close()
    assert revoker.revoked("node-a")
    assert not revoker.revoked("node-b")
    assert seams.kicked == ["node-a"]
    assert seams.persisted == ["node-a"]
    reported = [e for e in events if e["event"] == "bus_quota_exceeded"]
    assert len(reported) == (1 if written else 0)
    if written:
        assert reported[0]["security"] is True
        assert reported[0]["bucket"] == HEALTH


async def test_a_pinned_revocation_holds_until_the_list_has_it_and_ends_with_it():
    listed: dict[str, Revocation] = {}

    async def read() -> Mapping[str, Revocation]:
        return dict(listed)

    revoker = Revoker(read=read, kick=None, forget=lambda node: None, poll_s=1)
    await revoker.poll()
    await revoker.revoke_now(Revocation(node="node-a", reason="bus quota"))
    await revoker.poll()  # the list does not have it yet: still in force
    assert revoker.revoked("node-a")
    listed["node-a"] = Revocation(node="node-a", reason="bus quota")
    await revoker.poll()
    del listed["node-a"]  # the operator's unrevoke-node
    await revoker.poll()
    assert not revoker.revoked("node-a")
    # Written to the list and unrevoked before any read saw it: the list still decides.
    await revoker.revoke_now(Revocation(node="node-b", reason="bus quota"))
    revoker.unpin("node-b")
    assert revoker.revoked("node-b")
    await revoker.poll()
    assert not revoker.revoked("node-b")
