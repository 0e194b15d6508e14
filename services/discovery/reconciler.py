"""The slice reconciler: keeps the node's ResourceSlices equal to the desired ones.

Actual state comes from a list+watch of this driver's slices on this node, updated at once
with the answer of every write (so a sync never acts on a view older than its own writes).
Any event, inventory change or failure schedules a sync; a sync writes only on a real
difference. A slice the API rejects (422) is logged with the API's message, recorded as a
Node Event, counted in `dra_slice_rejections_total{status}`, listed in `rejections` (readiness
fails while it is not empty) and left out of the pool for a while (so it cannot cause a write
loop): it is sent again after a growing delay (`retry_backoff`, up to 5 minutes), at once when
the inventory or the server version changes, and leaves `rejections` when the API accepts it
(a rejection caused by an admission webhook or a quota may clear by itself). Transient errors
and conflicts are retried with backoff.

Devices the pre-publish check leaves out (`slices.desired`: e.g. an attribute value over 64
bytes) and partitions the server cannot publish are kept in `unpublished`: logged, counted in
`dra_slice_devices_dropped_total{reason}` and recorded as a Warning Event on the Node once per
newly dropped device (withheld partitions have theirs: `ResourceSliceFieldsDropped`);
readiness shows them as a detail and the inventory publisher marks them.

Version awareness: the API server's version (`GET /version`, read at start and again after
a relist or a failed sync, i.e. after a reconnect) decides the rules slices are built by
(`apirules`). When the server stores a slice without fields we sent (a feature gate is off),
`slice_fields_dropped` is logged and a Warning Event recorded once per newly found gate; the
stored form is adopted (no update loop) and the gates are added to the rules, so that, e.g.,
MIG partitions are withdrawn when their counters cannot be published.

Device taints (`taints`, with `--publish-device-taints`): the health agent's taints are part
of the desired pool; a change replans it, and the pool is laid out so that a taint changes
only the slice that holds its device (one update, the pool generation kept: `syncplan`).
Until the health KV has been listed, the taints the slices carry at start are kept.

Naming (see `slices`): new slices are named like v0.36 of the Go helper, by a hex index
prefix, because the v0.36 scheduler tries slices in name order; matching goes by content
first, so slices named `<node>-<driver>-` by an older agent are adopted as they are.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import structlog
from opentelemetry import context as otel_context
from opentelemetry import trace

from services.discovery import (
    apirules,
    dropped,
    events,
    instruments,
    serverversion,
    slices,
    syncplan,
    unpublished,
)
from services.discovery.scanner import DeviceScanner
from services.discovery.taints import DeviceTaints, published_taints
from shared import telemetry
from shared.backoff import Backoff
from shared.errors import (
    KubeAlreadyExistsError,
    KubeConflictError,
    KubeError,
    KubeNotFoundError,
    KubeTransientError,
    ProgrammingError,
    RecoverableError,
)
from shared.kube import watch
from shared.kube.client import KubeClient, WatchEvent
from shared.kube.resources import NODES, RESOURCE_SLICES
from shared.pb.drasuite.v1 import inventory_pb2

__all__ = ["DEVICES_DROPPED", "SliceReconciler"]

log = structlog.get_logger(__name__)

DEVICES_DROPPED = "ResourceSliceDevicesDropped"
"""The reason of the Node Event about devices left out of the slices."""

Obj = dict[str, Any]


def _name(obj: Obj) -> str:
    return str(obj.get("metadata", {}).get("name", ""))


def _older(candidate: Obj, known: Obj) -> bool:
    """Whether `candidate` is an older version than `known` (when versions are numbers)."""
    new = candidate.get("metadata", {}).get("resourceVersion", "")
    old = known.get("metadata", {}).get("resourceVersion", "")
    return new.isdigit() and old.isdigit() and int(new) < int(old)


def _generation(obj: Obj) -> int:
    return int(((obj.get("spec") or {}).get("pool") or {}).get("generation") or 0)


def _devices(obj: Obj) -> int:
    return len((obj.get("spec") or {}).get("devices") or [])


class SliceReconciler:
    """Publishes the scanner's inventory as the node's ResourceSlices."""

    def __init__(
        self,
        client: KubeClient,
        scanner: DeviceScanner,
        *,
        driver: str,
        node: str,
        backoff: Backoff | None = None,
        retry_backoff: Backoff | None = None,
        taints: DeviceTaints | None = None,
        dropped_devices: unpublished.Unpublished | None = None,
    ) -> None:
        """`taints`: the health agent's device taints to publish; None publishes none.

        `retry_backoff`: the delays before rejected slice contents are sent again.
        `dropped_devices`: where devices left out of the slices are kept (shared with readers).
        """
        self.client = client
        self.scanner = scanner
        self.taints = taints
        self.unpublished = dropped_devices or unpublished.Unpublished()
        self.driver = driver
        self.node = node
        self.published = asyncio.Event()
        """Set after the first sync that left the slices as desired."""
        self._backoff = backoff or Backoff(initial_s=0.1, max_s=10.0)
        self._actual: dict[str, Obj] = {}
        self._listed = False
        self._inventory: inventory_pb2.Inventory | None = None
        self._want: slices.DesiredPool | None = None
        self._wake = asyncio.Event()
        # Slice name -> (spec sent, spec stored) when the server stored something else.
        self._adopted: dict[str, tuple[str, str]] = {}
        # Content id -> API message of slice contents the API rejected, until it accepts them.
        self._rejected: dict[str, str] = {}
        # The rejected content ids left out of the pool until their retry is due.
        self._left_out: set[str] = set()
        self._retry_backoff = retry_backoff or Backoff(initial_s=2.0, max_s=300.0)
        self._retry = asyncio.Event()
        """Set when a rejection is recorded: a retry is to be scheduled."""
        self._unreported: list[unpublished.Dropped] = []
        self._report = asyncio.Event()
        # Highest pool generation seen or written: generations never go back.
        self._highest = 0
        self.rules: apirules.PublishRules | None = None
        """The rules slices are built by; None until the server version is known."""
        self._recheck_version = False
        self._withheld = 0
        self._replans = 0

    @property
    def rejections(self) -> Mapping[str, str]:
        """Slice contents the API refused (content id -> the API's message), read-only.

        Empty when every desired slice was accepted; readiness should fail while it is not.
        An entry leaves when the API accepts that content on a retry, and all of them when the
        inventory or the server version changes (and the pool is re-planned).
        """
        return MappingProxyType(self._rejected)

    @property
    def field_selector(self) -> str:
        return f"spec.nodeName={self.node},spec.driver={self.driver}"

    async def run(self) -> None:
        """Eternal: find the Node, follow slices and inventory, and sync on every change."""
        owner = await self._find_owner()
        self._use_rules(await serverversion.detect_at_start(self.client))
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._follow_slices(), name="slice-watch")
            tg.create_task(self._follow_inventory(), name="slice-desired")
            if self.taints is not None:
                tg.create_task(self._follow_taints(self.taints), name="slice-taints")
            tg.create_task(self._retry_rejected(), name="slice-retry")
            tg.create_task(self._report_dropped(owner), name="slice-drop-reporter")
            await self._sync_forever(owner)

    async def _find_owner(self) -> slices.Owner:
        """The Node's name and UID, retried until the Node exists."""
        backoff = Backoff(initial_s=0.2, max_s=5.0)
        while True:
            try:
                node = await self.client.get(NODES, self.node)
                return slices.Owner(self.node, str(node["metadata"]["uid"]))
            except (KubeError, RecoverableError) as exc:
                delay = backoff.next_delay()
                log.warning(
                    "node_lookup_failed", node=self.node, error=str(exc), retry_in_s=round(delay, 2)
                )
                await asyncio.sleep(delay)

    async def _recheck_rules(self) -> None:
        """After a reconnect: the server may have been upgraded; failures keep the old rules."""
        self._recheck_version = False
        try:
            rules = await serverversion.detect(self.client)
        except (KubeError, RecoverableError) as exc:
            log.warning("server_version_recheck_failed", error=str(exc))
            return
        if self.rules is None or rules.minor != self.rules.minor:
            self._use_rules(rules)

    def _use_rules(self, rules: apirules.PublishRules) -> None:
        log.info("slice_rules_chosen", driver=self.driver, node=self.node, rules=rules.describe())
        self.rules = rules
        self._replan()

    async def _follow_slices(self) -> None:
        async for item in watch.reflect(
            self.client, RESOURCE_SLICES, field_selector=self.field_selector
        ):
            if isinstance(item, WatchEvent):
                self._apply(item)
            else:
                self._actual = {_name(obj): obj for obj in item.items}
                self._recheck_version = self._listed  # a relist: the server may be new
                if not self._listed and self.taints is not None and not self.taints.listed:
                    self.taints.seed(published_taints(self._actual.values()))
                    self._replan()  # before the first sync, which must not lift them
                self._listed = True
            self._wake.set()
        raise ProgrammingError("slice watch ended; reflect() must run forever")

    def _apply(self, event: WatchEvent) -> None:
        name = _name(event.object)
        if event.type == "DELETED":
            self._actual.pop(name, None)
            return
        known = self._actual.get(name)
        if known is None or not _older(event.object, known):
            self._actual[name] = event.object

    async def _follow_inventory(self) -> None:
        seen = 0
        while True:
            current = await self.scanner.next(after=seen)
            seen = current.generation
            self._inventory = current
            self._replan()

    async def _follow_taints(self, taints: DeviceTaints) -> None:
        seen = taints.version
        while True:
            seen = await taints.next(after=seen)
            log.info("device_taints_changed", driver=self.driver, node=self.node, version=seen)
            self._replan()

    def _replan(self) -> None:
        """The desired pool from the latest inventory and rules; API rejections start over."""
        if self._inventory is None or self.rules is None:
            return
        want = slices.desired(
            self._inventory,
            rules=self.rules,
            taints=self.taints.current() if self.taints is not None else None,
            taintable=self.taints is not None,
        )
        for rejection in want.rejected:
            log.error(
                "device_rejected",
                driver=self.driver,
                node=self.node,
                device=rejection.name,
                reason=rejection.reason,
                problems=list(rejection.problems),
            )
        devices = {device.name for device in self._inventory.devices}
        newly = self.unpublished.update(want.rejected, want.withheld, devices=devices)
        for drop in newly:
            instruments.DEVICES_DROPPED.add(1, {"reason": drop.reason})
        # Withheld partitions already have their Event: the fields the server dropped.
        unreported = [drop for drop in newly if drop.reason != unpublished.WITHHELD]
        if unreported:
            self._unreported += unreported
            self._report.set()
        if len(want.withheld) != self._withheld:
            log.warning(
                "partitions_withheld",
                driver=self.driver,
                node=self.node,
                devices=len(want.withheld),
                rules=self.rules.describe(),
            )
            self._withheld = len(want.withheld)
        self._want, self._replans = want, self._replans + 1
        self._rejected.clear()
        self._left_out.clear()
        self._retry_backoff.reset()
        self._wake.set()

    async def _retry_rejected(self) -> None:
        """Eternal: after each rejection, wait the next delay, then send the contents again."""
        while True:
            await self._retry.wait()
            self._retry.clear()
            delay = self._retry_backoff.next_delay()
            log.info(
                "slice_retry_scheduled",
                driver=self.driver,
                node=self.node,
                rejected=len(self._rejected),
                retry_in_s=round(delay, 2),
            )
            await asyncio.sleep(delay)
            if self._rejected and self._left_out:
                self._left_out.clear()
                self._wake.set()

    async def _report_dropped(self, owner: slices.Owner) -> None:
        """Eternal: a Warning Event on the Node for every batch of newly dropped devices."""
        while True:
            await self._report.wait()
            self._report.clear()
            batch, self._unreported = self._unreported, []
            text = unpublished.describe(batch) + "; the rest of the pool is published"
            await events.warn_node(self.client, owner, reason=DEVICES_DROPPED, message=text)

    async def _sync_forever(self, owner: slices.Owner) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not self._listed or self._want is None:
                continue
            replans = self._replans
            try:
                if self._recheck_version:
                    await self._recheck_rules()
                await self.sync(owner, self._want)
            except RecoverableError as exc:
                # Lost connection or server trouble: it may come back as another version.
                self._recheck_version |= isinstance(exc, KubeTransientError)
                retry_after = exc.retry_after_s if isinstance(exc, KubeTransientError) else None
                delay = self._backoff.next_delay(at_least_s=retry_after or 0.0)
                log.warning("slice_sync_failed", error=str(exc), retry_in_s=round(delay, 3))
                await asyncio.sleep(delay)
                self._wake.set()
                continue
            self._backoff.reset()
            if self._replans == replans:  # else the pool changed meanwhile: sync again first
                self.published.set()

    async def sync(self, owner: slices.Owner, want: slices.DesiredPool) -> syncplan.Plan:
        """One pass: plan against the current view, then delete, update and create.

        Stops early when a write taught it something that changes the desired pool (a gate
        found off): the next pass plans again.
        """
        actual = list(self._actual.values())
        self._highest = max([self._highest, *map(_generation, actual)])
        want, replans = want.without(self._left_out), self._replans
        plan = syncplan.plan(want, actual, owner=owner, adopted=self._adopted, floor=self._highest)
        if plan.empty:
            self._forget_stale_rejections()
            return plan
        # Linked, not a child: one sync may carry the changes of several scans, and it runs
        # on its own schedule (retries, API server outages).
        scan = self.scanner.trace
        scanned = trace.get_current_span(scan).get_span_context() if scan is not None else None
        links = [trace.Link(scanned)] if scanned is not None and scanned.is_valid else None
        with telemetry.tracer(__name__).start_as_current_span(
            "discovery.sync_slices", context=otel_context.Context(), links=links
        ):
            log.info(
                "slice_sync_started",
                driver=self.driver,
                node=self.node,
                pool=want.pool,
                generation=plan.generation,
                deletes=len(plan.deletes),
                updates=len(plan.updates),
                creates=len(plan.creates),
            )
            for obj in plan.deletes:
                await self._delete(obj)
            writes = [(obj, False) for obj in plan.updates] + [(obj, True) for obj in plan.creates]
            for obj, create in writes:
                await self._write(obj, owner=owner, create=create)
                if self._replans != replans:
                    break  # re-planned meanwhile: the rest of this plan is out of date
            else:
                self._forget_stale_rejections()
        return plan

    def _forget_stale_rejections(self) -> None:
        """After a whole pass, a rejected content that was not left out is no longer refused:
        it was accepted, or is no longer wanted (the empty stand-in of a retried pool)."""
        for content in [c for c in self._rejected if c not in self._left_out]:
            del self._rejected[content]
        if not self._rejected:
            self._retry_backoff.reset()

    async def _delete(self, obj: Obj) -> None:
        name, metadata = _name(obj), obj.get("metadata", {})
        try:
            await self.client.delete(
                RESOURCE_SLICES,
                name,
                uid=metadata.get("uid", ""),
                resource_version=metadata.get("resourceVersion", ""),
            )
        except KubeNotFoundError:
            pass
        except KubeConflictError:
            await self._reread(name)
            raise
        self._actual.pop(name, None)
        self._adopted.pop(name, None)
        log.info("slice_deleted", driver=self.driver, node=self.node, slice=name)

    async def _write(self, obj: Obj, *, owner: slices.Owner, create: bool) -> None:
        sent = slices.fingerprint(obj["spec"])
        content = slices.content_id(slices.content_of(obj["spec"]))
        if content in self._left_out:
            return  # the empty stand-in of a wholly rejected pool was rejected too
        try:
            if create:
                stored = await self.client.create(RESOURCE_SLICES, obj)
            else:
                stored = await self.client.replace(RESOURCE_SLICES, obj)
        except KubeNotFoundError as exc:
            self._actual.pop(_name(obj), None)  # deleted meanwhile (kubelet wipe): re-create
            raise KubeConflictError(f"update {_name(obj)}: deleted meanwhile") from exc
        except KubeConflictError:
            await self._reread(_name(obj))
            raise
        except KubeAlreadyExistsError as exc:
            raise KubeTransientError(str(exc)) from exc
        except KubeError as exc:
            await self._rejected_by_api(obj, owner=owner, error=exc)
            return
        self._stored(stored, sent=sent, created=create)
        if self._rejected.pop(content, None) is not None:
            log.info("slice_accepted_on_retry", driver=self.driver, node=self.node, content=content)
        await self._check_dropped(obj, stored, owner=owner)

    def _stored(self, stored: Obj, *, sent: str, created: bool) -> None:
        name = _name(stored)
        self._actual[name] = stored
        self._highest = max(self._highest, _generation(stored))
        kept = slices.fingerprint(stored.get("spec") or {})
        if kept == sent:
            self._adopted.pop(name, None)
        else:
            # Fields dropped by a disabled feature gate or rewritten by the server: adopt the
            # stored form as equal to what we sent, or we would update it forever.
            self._adopted[name] = (sent, kept)
            log.debug("slice_stored_differently", slice=name, sent=sent, stored=kept)
        log.info(
            "slice_created" if created else "slice_updated",
            driver=self.driver,
            node=self.node,
            slice=name,
            generation=_generation(stored),
            devices=_devices(stored),
        )

    async def _check_dropped(self, sent: Obj, stored: Obj, *, owner: slices.Owner) -> None:
        """Report fields the server dropped (gate off) once per gate, and publish without them."""
        paths = dropped.dropped_paths(sent.get("spec") or {}, stored.get("spec") or {})
        if not paths or self.rules is None:
            return
        gates = dropped.likely_gates(paths) or ["unknown"]
        if set(gates) <= self.rules.disabled_gates:
            return
        log.warning(
            "slice_fields_dropped",
            driver=self.driver,
            node=self.node,
            slice=_name(stored),
            fields=paths,
            gates=gates,
        )
        self.rules = self.rules.without(gates)
        self._replan()
        text = dropped.message(slice_name=_name(stored), paths=paths, gates=gates)
        await events.warn_node(
            self.client, owner, reason="ResourceSliceFieldsDropped", message=text
        )

    async def _rejected_by_api(self, obj: Obj, *, owner: slices.Owner, error: KubeError) -> None:
        if error.status in (401, 403):
            raise KubeTransientError(str(error), status=error.status) from error
        content = slices.content_id(slices.content_of(obj["spec"]))
        self._rejected[content] = str(error)
        self._left_out.add(content)
        self._wake.set()  # re-plan the pool without it
        self._retry.set()
        instruments.SLICES_REJECTED.add(1, {"status": str(error.status)})
        log.error(
            "slice_rejected",
            driver=self.driver,
            node=self.node,
            slice=_name(obj) or obj["metadata"].get("generateName", ""),
            status=error.status,
            error=str(error),
            devices=[d.get("name") for d in obj["spec"].get("devices") or []],
        )
        await events.warn_node(
            self.client, owner, reason="ResourceSliceRejected", message=str(error)
        )

    async def _reread(self, name: str) -> None:
        """Refresh one slice after a conflict; the next sync plans against it."""
        try:
            self._actual[name] = await self.client.get(RESOURCE_SLICES, name)
        except KubeNotFoundError:
            self._actual.pop(name, None)
        except RecoverableError as exc:
            log.warning("slice_reread_failed", slice=name, error=str(exc))
