"""Identity -> NATS permissions: what each role may publish and subscribe to, subject by subject.

Every subject comes from `shared.bus.subjects.Names`, and is one an agent's own call sends:
KV puts (`$KV.<bucket>.<key>`), direct gets with the key in the API subject, subscriptions to
its keys' republished copies (`dra.kv.<bucket>.<key>`) and its buckets' leader advisories (a
node agent holds no consumer: `shared.bus.kvfollow`), JetStream publishes, control requests and
their replies, and the request that
has the auth service certify its writer key (`dra.auth.certify.<role>.<node>`: the subject
alone tells the certifier who asks, so nobody else may publish it). A node's grants name its
own driver/node tokens only. Nobody but the provisioner creates or updates a stream; nobody
deletes or purges one or deletes a message, and only the server publishes republished copies
and advisories: `DENIED` is added to every other identity. Each
user JWT carries limits on subscriptions, data and payload (`Limits`), but nats-server (2.15)
does not apply them to the users of an auth callout: what holds is the app account's
per-connection `max_subscriptions` (256) and `max_payload` (1 MiB) in the server config, so
no role's limits here go beyond those. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from services.natsauth.identity import Identity
from shared.bus.subjects import Names

__all__ = [
    "AUDITOR",
    "CERTIFIER",
    "DENIED",
    "PROVISIONER",
    "Limits",
    "Permissions",
    "for_identity",
]

PROVISIONER = "provisioner"
"""The auth service's own role in the app account: it makes every stream, before any agent."""
CERTIFIER = "certifier"
"""The auth service's other role in the app account: it answers certify requests, nothing else."""
AUDITOR = "auditor"
"""The auth service's quota auditor: it watches the buckets and deletes entries over a node's
quota (`quotaauditor`); its identity's node is the replica's own id."""

_NEVER = (
    "$JS.API.STREAM.DELETE.>",
    "$JS.API.STREAM.PURGE.>",
    "$JS.API.STREAM.MSG.DELETE.>",
    "$JS.API.STREAM.SNAPSHOT.>",
    "$JS.API.STREAM.RESTORE.>",
    "$JS.API.ACCOUNT.PURGE.>",
    "$JS.EVENT.>",
    Names.kv_followed("*", ">"),
)
DENIED = ("$JS.API.STREAM.CREATE.>", "$JS.API.STREAM.UPDATE.>", *_NEVER)


@dataclass(frozen=True, slots=True)
class Limits:
    """The `subs`, `data` and `payload` limits of a user JWT (-1: none)."""

    subs: int
    data: int
    payload: int


_MIB = 1 << 20
# An agent holds its inbox, its control subject and two subscriptions per watch (its keys'
# republished copies and the stream's leader advisory); its largest message is an inventory
# (the inventory bucket's max_msg_size).
AGENT_LIMITS = Limits(subs=64, data=64 * _MIB, payload=1 * _MIB)
OPERATOR_LIMITS = Limits(subs=256, data=256 * _MIB, payload=1 * _MIB)
PROVISIONER_LIMITS = Limits(subs=8, data=1 * _MIB, payload=64 * 1024)
CERTIFIER_LIMITS = Limits(subs=8, data=16 * _MIB, payload=64 * 1024)
AUDITOR_LIMITS = Limits(subs=8, data=64 * _MIB, payload=1024)


@dataclass(frozen=True, slots=True)
class Permissions:
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    deny_publish: tuple[str, ...] = DENIED
    allow_responses: bool = False
    """Reply once to each request received (control requests to the health agent)."""
    inbox: str = ""
    limits: Limits = AGENT_LIMITS

    def claims(self) -> dict[str, Any]:
        """The `pub`, `sub`, `resp` and limit fields of a NATS user JWT."""
        body: dict[str, Any] = {
            "pub": {"allow": list(self.publish), "deny": list(self.deny_publish)},
            "sub": {"allow": list(self.subscribe)},
            "subs": self.limits.subs,
            "data": self.limits.data,
            "payload": self.limits.payload,
        }
        if self.allow_responses:
            body["resp"] = {"max": 1, "ttl": 0}
        return body


@dataclass
class _Grants:
    names: Names
    role: str
    node: str
    publish: list[str] = field(default_factory=list)
    subscribe: list[str] = field(default_factory=list)

    def bucket(self, bucket: str) -> None:
        """Open the bucket (stream info): nats-py and the config check read it."""
        self.publish.append(self.names.js_stream_info(self.names.kv_stream(bucket)))

    def read(self, bucket: str, keys: Iterable[str]) -> None:
        """Follow `keys` (`shared.bus.kvfollow`): direct gets of them, stream info (to list a
        pattern's keys), the stream's republished copies of them and its leader advisory."""
        self.bucket(bucket)
        stream = self.names.kv_stream(bucket)
        for key in keys:
            self.publish.append(self.names.js_direct_get(bucket, key))
            self.subscribe.append(self.names.kv_followed(bucket, key))
        self.subscribe.append(self.names.js_leader_elected(stream))

    def write(self, bucket: str, keys: Iterable[str]) -> None:
        self.bucket(bucket)
        self.publish += [self.names.kv_subject(bucket, key) for key in keys]

    def build(self, inbox: str, *, allow_responses: bool = False) -> Permissions:
        return Permissions(
            publish=tuple(dict.fromkeys(self.publish)),
            subscribe=(f"{inbox}.>", *dict.fromkeys(self.subscribe)),
            allow_responses=allow_responses,
            inbox=inbox,
        )


def for_identity(identity: Identity, *, drivers: Iterable[str], names: Names) -> Permissions:
    """The grants of `identity`, for every driver its agents may act for."""
    if identity.role == "operator":
        return _operator(names)
    if identity.role == PROVISIONER:
        return _provisioner(names)
    if identity.role == CERTIFIER:
        return _certifier(names)
    if identity.role == AUDITOR:
        return _auditor(names, identity.node)
    node = identity.node
    grants = _Grants(names, identity.role, node)
    if identity.role in ("discovery", "allocation", "health"):
        grants.publish.append(names.certify(identity.role, node))
    for driver in drivers:
        inventory = names.inventory_key(driver, node)
        health = names.health_keys(driver, node)
        claims = names.claim_keys(driver, node)
        match identity.role:
            case "discovery":
                grants.write(names.inventory_bucket, [inventory])
                grants.read(names.inventory_bucket, [inventory])
                grants.read(names.health_bucket, [health])
            case "allocation":
                grants.read(names.inventory_bucket, [inventory])
                grants.read(names.health_bucket, [health])
                grants.write(names.claims_bucket, [claims])
                grants.read(names.claims_bucket, [claims])
            case "health":
                grants.read(names.inventory_bucket, [inventory])
                grants.write(names.health_bucket, [health])
                grants.read(names.health_bucket, [health])
                grants.read(names.claims_bucket, [claims])
                grants.publish.append(names.js_stream_info(names.alerts_stream))
                grants.publish.append(names.alerts(driver, node))
                grants.subscribe.append(names.node_control(driver, node))
            case _:
                raise ValueError(f"unknown role {identity.role!r}")
    inbox = names.inbox_prefix(identity.role, node)
    return grants.build(inbox, allow_responses=identity.role == "health")


def _provisioner(names: Names) -> Permissions:
    """Create, read and update the bus's streams, and nothing else (no message, no consumer)."""
    streams = [names.kv_stream(bucket) for bucket in names.buckets] + [names.alerts_stream]
    publish = ["$JS.API.INFO"]
    for stream in streams:
        publish += [f"$JS.API.STREAM.{call}.{stream}" for call in ("INFO", "CREATE", "UPDATE")]
    inbox = names.inbox_prefix(PROVISIONER)
    return Permissions(
        publish=tuple(publish), subscribe=(f"{inbox}.>",), deny_publish=_NEVER, inbox=inbox,
        limits=PROVISIONER_LIMITS,
    )  # fmt: skip


def _certifier(names: Names) -> Permissions:
    """Hear every certify request (in a queue group) and answer each once; publish nothing."""
    inbox = names.inbox_prefix(CERTIFIER)
    # An empty allow list would allow everything not denied: allow only its own inbox.
    return Permissions(
        publish=(f"{inbox}.>",), subscribe=(f"{inbox}.>", names.certify_wildcard),
        deny_publish=DENIED,
        allow_responses=True, inbox=inbox, limits=CERTIFIER_LIMITS,
    )  # fmt: skip


def _auditor(names: Names, replica: str) -> Permissions:
    """Watch every key of each bucket through its own consumers (`auditor-<replica>-watch`:
    the replica id is the process's own), and delete entries of
    the buckets whose keys a node chooses (health, claims); nothing else. The inventory's one
    key per node cannot go over its quota."""
    name = names.consumer(AUDITOR, replica, "watch")
    publish = []
    for bucket in names.buckets:
        publish += [
            names.js_stream_info(names.kv_stream(bucket)),
            names.js_consumer_create(bucket, ">", consumer=name),
            names.js_consumer_delete(bucket, name),
            names.js_consumer_info(bucket, name),
        ]
    publish += [names.kv_subject(bucket, ">") for bucket in (names.health_bucket,
                                                             names.claims_bucket)]  # fmt: skip
    inbox = names.inbox_prefix(AUDITOR, replica)
    return Permissions(
        publish=tuple(publish), subscribe=(f"{inbox}.>",), inbox=inbox, limits=AUDITOR_LIMITS
    )


def _operator(names: Names) -> Permissions:
    """Read everything, send control requests, remove stale consumers; the same denials."""
    publish = [
        names.control_wildcard,
        "$JS.API.INFO",
        "$JS.API.STREAM.INFO.*",
        "$JS.API.STREAM.NAMES",
        "$JS.API.STREAM.LIST",
        "$JS.API.STREAM.MSG.GET.*",
        "$JS.API.DIRECT.GET.>",
        "$JS.API.CONSUMER.CREATE.>",
        "$JS.API.CONSUMER.INFO.>",
        "$JS.API.CONSUMER.NAMES.>",
        "$JS.API.CONSUMER.LIST.>",
        "$JS.API.CONSUMER.DELETE.>",
        "$JS.API.CONSUMER.MSG.NEXT.>",
        "$JS.ACK.>",
        "$JS.FC.>",
    ]
    inbox = names.inbox_prefix("operator")
    return Permissions(
        publish=tuple(publish), subscribe=(f"{inbox}.>",), inbox=inbox, limits=OPERATOR_LIMITS
    )
