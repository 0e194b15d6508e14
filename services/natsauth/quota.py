"""Per-node quotas of the KV buckets: how many keys and bytes one node may hold in each.

nats-server bounds a bucket as a whole (`shared.bus.streams`: `max_bytes`, `max_msg_size`, one
value per key), not one node's share of it: `health@N` may put any key `<driver>.<N>.<name>`,
`allocation@N` any claim key of N, so one node alone could fill a bucket and every other
node's new keys would be refused. The quota auditor (`quotaauditor`) holds each node to:

- keys: the inventory 1 per driver (the grants allow no other key), the health records the
  devices of one node, the prepared claims those of one node, each device or claim bound
  with a margin (`MARGIN`) so that a well-behaved node never comes near it;
- bytes: those keys times the bucket's `max_msg_size`, which the provisioning settings
  (`shared.bus.streams`) define: one node at its full quota holds a bounded share of the
  bucket (`share_of_bucket`).

A bucket is named by its unprefixed name as in `shared.bus.streams.limits_of`. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.bus import streams

__all__ = [
    "MARGIN",
    "MAX_DEVICES_PER_NODE",
    "MAX_PREPARED_CLAIMS_PER_NODE",
    "NodeQuota",
    "base_bucket",
    "quota_of",
    "share_of_bucket",
]

MAX_DEVICES_PER_NODE = 128
"""Devices (and partitions) one node publishes: a full ResourceSlice's worth."""
MAX_PREPARED_CLAIMS_PER_NODE = 128
"""Claims prepared on one node at once: above the kubelet's default of 110 pods."""
MARGIN = 2
_KEYS = {
    "dra_inventory": 1,
    "dra_health": MAX_DEVICES_PER_NODE * MARGIN,
    "dra_claims": MAX_PREPARED_CLAIMS_PER_NODE * MARGIN,
}


@dataclass(frozen=True, slots=True)
class NodeQuota:
    keys: int
    bytes: int


def base_bucket(bucket: str) -> str:
    """The bucket's name without the bus namespace prefix (`dra_claims` of `t1_dra_claims`);
    "" for a bucket that has no quota."""
    for name in _KEYS:
        if bucket == name or bucket.endswith(f"_{name}"):
            return name
    return ""


def quota_of(bucket: str) -> NodeQuota | None:
    """One node's quota (per driver) in `bucket`; None for a bucket without one."""
    name = base_bucket(bucket)
    if not name:
        return None
    keys = _KEYS[name]
    return NodeQuota(keys=keys, bytes=keys * streams.limits_of(name).max_msg_size)


def share_of_bucket(bucket: str) -> float:
    """The part of the bucket's `max_bytes` one node at its full quota holds."""
    quota = quota_of(bucket)
    return 0.0 if quota is None else quota.bytes / streams.limits_of(bucket).max_bytes
