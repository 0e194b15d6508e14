"""The streams of the bus as their provisioner makes them: every field, in the wire form.

One trusted component creates them before any agent runs (`dra-nats-auth` at start, or on the
open bus the first client), and agents refuse to run on a stream that differs from this
(`shared.bus.convergence`). Per bucket, what stops one node from touching others' records:

- `deny_purge`, `deny_delete`, rollup headers off: a `Nats-Rollup` publish on one's own key
  cannot purge the bucket, and nobody deletes messages or purges. nats-server never turns
  `deny_purge` off again.
- `discard: new` with `max_msgs_per_subject`: a full bucket refuses new keys, but replacing a
  key's value still succeeds (the old one goes), so nobody's records are pushed out.
- `max_msg_size`, `max_bytes`: one value and one bucket are bounded.
- `republish` to `dra.kv.<bucket>.>`: node agents follow their keys there instead of holding
  consumers (`shared.bus.kvfollow`); only the server publishes there.
- `allow_msg_ttl`: a delete marker carries `Nats-TTL` (`MARKER_TTL_S`) and then goes, so the
  claims bucket (a key per prepared claim, deleted at unprepare) does not grow with every
  claim ever prepared; with rollups off, nats-server would never remove those markers itself.

Only `num_replicas` (`TUNABLE`) may differ: an operator changes it in place. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shared.bus.subjects import Names
from shared.errors import FatalError

__all__ = [
    "ALERT_DUPLICATE_WINDOW_S",
    "ALERT_MAX_AGE_S",
    "MARKER_TTL_S",
    "MAX_CONSUMERS",
    "TUNABLE",
    "BucketLimits",
    "StreamTamperedError",
    "alerts_stream",
    "all_streams",
    "kv_stream",
    "limits_of",
]

MAX_CONSUMERS = 50_000
"""Consumers a bucket or the alert stream may hold: at most the app account's `max_consumers`
(nats-server refuses more). Node agents hold none (`shared.bus.kvfollow`); operators, the quota
auditors and alert readers do. nats-server 2.15 enforces 1,000 on a stream that sets none."""

MARKER_TTL_S = 300
"""How long a delete marker stays: a watcher that is connected sees it; one that (re)starts
later replays the keys that exist, and a missing key is a deleted one."""

ALERT_MAX_AGE_S = 7 * 24 * 3600.0
ALERT_DUPLICATE_WINDOW_S = 120.0
TUNABLE = ("num_replicas",)
"""Fields an operator may change in place; agents only ever grow them."""

_NS = 1_000_000_000
_KIB, _MIB = 1 << 10, 1 << 20


class StreamTamperedError(FatalError):
    """A bucket or stream differs from what its provisioner makes: the agent will not use it."""

    def __init__(self, stream: str, changes: dict[str, str]) -> None:
        detail = ", ".join(f"{field}: {change}" for field, change in sorted(changes.items()))
        super().__init__(f"stream {stream} differs from the provisioned config: {detail}")
        self.stream = stream
        self.changes = changes


@dataclass(frozen=True, slots=True)
class BucketLimits:
    max_bytes: int
    max_msg_size: int


# A node writes one inventory key, one health key per device and one claim key per prepared
# claim. Streams reserve their max_bytes on the server: together 1 GiB, what the base's 2Gi
# volume and the app account's max_file (1280MB) hold; for 5,000 nodes that is 100 KiB of
# inventory, 26 KiB of health records and 26 KiB of prepared claims per node.
_LIMITS = {
    "dra_inventory": BucketLimits(max_bytes=512 * _MIB, max_msg_size=1 * _MIB),
    "dra_health": BucketLimits(max_bytes=128 * _MIB, max_msg_size=16 * _KIB),
    "dra_claims": BucketLimits(max_bytes=128 * _MIB, max_msg_size=64 * _KIB),
}
_ALERTS_LIMITS = BucketLimits(max_bytes=256 * _MIB, max_msg_size=16 * _KIB)
_ALERTS_PER_NODE = 1000
"""Alerts kept per node subject: a node flooding its subject pushes out only its own."""


def limits_of(bucket: str) -> BucketLimits:
    """The limits of a bucket by its unprefixed name (`dra_claims` of `t1_dra_claims`)."""
    for name, limits in _LIMITS.items():
        if bucket == name or bucket.endswith(f"_{name}"):
            return limits
    return _LIMITS["dra_health"]


def _common(name: str, subjects: list[str], replicas: int) -> dict[str, Any]:
    return {
        "name": name,
        "subjects": subjects,
        "retention": "limits",
        "max_consumers": MAX_CONSUMERS,
        "max_msgs": -1,
        "max_age": 0,
        "storage": "file",
        "num_replicas": replicas,
        "duplicate_window": int(120 * _NS),
        "compression": "none",
        "mirror_direct": False,
        "sealed": False,
        "deny_delete": True,
        "deny_purge": True,
        "allow_rollup_hdrs": False,
        "consumer_limits": {},
    }


def kv_stream(bucket: str, *, replicas: int) -> dict[str, Any]:
    """The stream of a KV bucket: one value per key, direct gets (the key is in the API
    subject, so a permission can name it), delete markers that expire."""
    limits = limits_of(bucket)
    return {
        **_common(Names.kv_stream(bucket), [Names.kv_subject(bucket, ">")], replicas),
        "max_bytes": limits.max_bytes,
        "max_msg_size": limits.max_msg_size,
        "max_msgs_per_subject": 1,
        "discard": "new",
        "allow_direct": True,
        "allow_msg_ttl": True,
        # What it stores, also to where node agents follow their keys (`kvfollow`).
        "republish": {"src": Names.kv_subject(bucket, ">"), "dest": Names.kv_followed(bucket, ">")},
    }


def alerts_stream(
    name: str,
    subjects: list[str],
    *,
    replicas: int,
    max_age_s: float = ALERT_MAX_AGE_S,
    duplicate_window_s: float = ALERT_DUPLICATE_WINDOW_S,
) -> dict[str, Any]:
    """The alert stream: a log per node subject; the oldest of a node's alerts go first."""
    return {
        **_common(name, subjects, replicas),
        "max_age": int(max_age_s * _NS),
        "duplicate_window": int(duplicate_window_s * _NS),
        "max_bytes": _ALERTS_LIMITS.max_bytes,
        "max_msg_size": _ALERTS_LIMITS.max_msg_size,
        "max_msgs_per_subject": _ALERTS_PER_NODE,
        "discard": "old",
        "allow_direct": False,
        "allow_msg_ttl": False,
    }


def all_streams(names: Names, *, replicas: int) -> list[dict[str, Any]]:
    """Every stream of the bus under `names`, as the provisioner makes it."""
    configs = [kv_stream(bucket, replicas=replicas) for bucket in names.buckets]
    configs.append(alerts_stream(names.alerts_stream, [names.alerts_wildcard], replicas=replicas))
    return configs
