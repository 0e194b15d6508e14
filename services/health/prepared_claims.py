"""The claims prepared on this node, from the prepared-claims KV (`dra_claims`, written by the
allocation agent): which pods use a device, for pod Events, and which devices are passed through
to virtual machines (`DEVICE_PASSTHROUGH_VFIO`), which the evaluator does not judge.

Only this node's keys are watched (`Names.claim_keys`), so no other node's claims and no
cluster-wide ResourceClaim list are needed. The `claim-watcher` task mirrors the keys into a
`PreparedClaims` view; a value that does not decode, or names another driver, node or claim
than its key, is logged and skipped. After each replay, keys that no longer exist are dropped.
`changed` is called once the first replay is complete and after every change since.

Each change that carries a trace is handled in a span of it (`health.claim_update`, with the
claim UID): a child of the writer's span for a change seen live, linked (a new trace) for a
value replayed after a (re)start, as the allocation agent's watchers do.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import structlog

from shared import telemetry
from shared.bus import codec, kv
from shared.bus.connection import Bus
from shared.errors import MalformedMessageError
from shared.pb.drasuite.v1 import claim_pb2

__all__ = ["PreparedClaims", "claim_watcher"]

log = structlog.get_logger(__name__)
tracer = telemetry.tracer(__name__)


class PreparedClaims:
    """The node's prepared claims by claim UID, as last seen in the KV."""

    def __init__(self) -> None:
        self._claims: dict[str, claim_pb2.PreparedClaim] = {}
        self.synced = False
        """True once a replay of the node's keys was complete: `passthrough()` is then whole."""

    def put(self, uid: str, claim: claim_pb2.PreparedClaim) -> None:
        self._claims[uid] = claim

    def remove(self, uid: str) -> None:
        self._claims.pop(uid, None)

    def retain(self, uids: Iterable[str]) -> None:
        keep = set(uids)
        for uid in [u for u in self._claims if u not in keep]:
            del self._claims[uid]

    def passthrough(self) -> frozenset[tuple[str, str]]:
        """The devices, as (pool, device), that prepared claims pass through to VMs."""
        return frozenset(
            (d.pool, d.device)
            for c in self._claims.values()
            for d in c.devices
            if d.passthrough == claim_pb2.DEVICE_PASSTHROUGH_VFIO
        )

    def claims(self) -> list[claim_pb2.PreparedClaim]:
        """In a stable order (namespace, name), so that attribution is deterministic."""
        return sorted(self._claims.values(), key=lambda c: (c.namespace, c.name, c.claim_uid))


async def claim_watcher(
    bus: Bus,
    *,
    claims: PreparedClaims,
    driver: str,
    node: str,
    changed: Callable[[], None] | None = None,
) -> None:
    """Eternal: keep `claims` equal to the node's keys in the prepared-claims KV; `changed`
    (must not block) after the first complete replay and after every change since."""
    keys = bus.names.claim_keys(driver, node)
    prefix = keys.removesuffix("*")
    seen: set[str] = set()

    def notify() -> None:
        if changed is not None and claims.synced:
            changed()

    async for change in kv.watch(bus, bucket=bus.names.claims_bucket, keys=keys):
        if change.synced:
            claims.retain(seen)  # the replay before this marker listed every key that exists
            seen = set()
            claims.synced = True
            notify()
            continue
        uid = change.key.removeprefix(prefix)
        with telemetry.continued(
            tracer,
            "health.claim_update",
            change.trace,
            linked=change.replayed,
            attributes={"claim_uid": uid, "node": node},
        ):
            if change.value is None:
                claims.remove(uid)
                notify()
                continue
            seen.add(uid)
            try:
                claim = codec.decode(claim_pb2.PreparedClaim, change.value, subject=change.key)
            except MalformedMessageError as exc:
                log.error("prepared_claim_malformed", key=change.key, error=str(exc))
                continue
            named = (claim.driver, claim.node, claim.claim_uid)
            if named != (driver, node, uid):
                owner = "/".join(repr(name[:64]) for name in named)
                log.error("prepared_claim_malformed", key=change.key, error=f"claim of {owner}")
                continue
            claims.put(uid, claim)
            notify()
