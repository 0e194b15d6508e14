"""Identity -> NATS permissions: what each role may publish and subscribe to, subject by subject.

Every subject comes from `shared.bus.subjects.Names`, and is one an agent's own call sends:
KV puts (`$KV.<bucket>.<key>`), direct gets with the key in the API subject, named consumers
with the filter in the API subject, JetStream publishes, control requests and their replies.
A node's grants name its own driver/node tokens only. Nobody may update, delete or purge a
stream, delete a message or a consumer: `DENIED` is added to every identity. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from services.natsauth.identity import Identity
from shared.bus.subjects import Names

__all__ = ["DENIED", "Permissions", "for_identity"]

DENIED = (
    "$JS.API.STREAM.UPDATE.>",
    "$JS.API.STREAM.DELETE.>",
    "$JS.API.STREAM.PURGE.>",
    "$JS.API.STREAM.MSG.DELETE.>",
    "$JS.API.CONSUMER.DELETE.>",
    "$JS.API.STREAM.SNAPSHOT.>",
    "$JS.API.STREAM.RESTORE.>",
    "$JS.API.ACCOUNT.PURGE.>",
)


@dataclass(frozen=True, slots=True)
class Permissions:
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    deny_publish: tuple[str, ...] = DENIED
    allow_responses: bool = False
    """Reply once to each request received (control requests to the health agent)."""
    inbox: str = ""

    def claims(self) -> dict[str, Any]:
        """The `pub`, `sub` and `resp` fields of a NATS user JWT."""
        body: dict[str, Any] = {
            "pub": {"allow": list(self.publish), "deny": list(self.deny_publish)},
            "sub": {"allow": list(self.subscribe)},
        }
        if self.allow_responses:
            body["resp"] = {"max": 1, "ttl": 0}
        return body


@dataclass
class _Grants:
    names: Names
    publish: list[str] = field(default_factory=list)
    subscribe: list[str] = field(default_factory=list)

    def bucket(self, bucket: str) -> None:
        """Open (info) and create the bucket: agents create what they use on an empty server."""
        stream = self.names.kv_stream(bucket)
        self.publish += [self.names.js_stream_info(stream), self.names.js_stream_create(stream)]

    def read(self, bucket: str, keys: Iterable[str]) -> None:
        self.bucket(bucket)
        for key in keys:
            self.publish.append(self.names.js_direct_get(bucket, key))
            self.publish.append(self.names.js_consumer_create(bucket, key))

    def write(self, bucket: str, keys: Iterable[str]) -> None:
        self.bucket(bucket)
        self.publish += [self.names.kv_subject(bucket, key) for key in keys]

    def build(self, inbox: str, *, allow_responses: bool = False) -> Permissions:
        return Permissions(
            publish=tuple(dict.fromkeys(self.publish)),
            subscribe=(f"{inbox}.>", *self.subscribe),
            allow_responses=allow_responses,
            inbox=inbox,
        )


def for_identity(identity: Identity, *, drivers: Iterable[str], names: Names) -> Permissions:
    """The grants of `identity`, for every driver its agents may act for."""
    if identity.role == "operator":
        return _operator(names)
    grants = _Grants(names)
    node = identity.node
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
                stream = names.alerts_stream
                grants.publish += [names.js_stream_info(stream), names.js_stream_create(stream)]
                grants.publish.append(names.alerts(driver, node))
                grants.subscribe.append(names.node_control(driver, node))
            case _:
                raise ValueError(f"unknown role {identity.role!r}")
    inbox = names.inbox_prefix(identity.role, node)
    return grants.build(inbox, allow_responses=identity.role == "health")


def _operator(names: Names) -> Permissions:
    """Read everything, send control requests; the same denials as everyone."""
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
        "$JS.API.CONSUMER.MSG.NEXT.>",
        "$JS.ACK.>",
        "$JS.FC.>",
    ]
    publish += [names.js_stream_create(names.kv_stream(bucket)) for bucket in names.buckets]
    publish.append(names.js_stream_create(names.alerts_stream))
    inbox = names.inbox_prefix("operator")
    return Permissions(publish=tuple(publish), subscribe=(f"{inbox}.>",), inbox=inbox)
