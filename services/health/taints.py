"""DeviceTaintRules for this node's devices: fault taints from the policy, and manual drains.

`want()` states which devices carry which fault taint; `drain()`/`undrain()` add or remove a
device's `<driver>/drain` taint. `run()` (the taint-writer task) negotiates the API version,
adopts the rules an earlier run left (by label; its drain rules become drains again, so a
drain survives a restart) and converges: create or update idempotently, delete what is no
longer wanted. Without a served DeviceTaintRule version it logs once, reports
`available = False` and keeps running. An API server without the `None` effect (1.34)
rejects the first such rule; from then on `None` taints are skipped (logged once).

With target `slice` the discovery agent publishes the taints inside the ResourceSlice (from
the health records' `taints`): this writer then owns no rule and deletes those an earlier
run left (keeping their drains), learns from `GET /version` whether the server has the
`None` effect (1.35+), and drains persist in the records (`restore()` at start).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import structlog
from opentelemetry.context import Context

from services.health.policy import Taint, label_value, taint_key
from services.health.rule_objects import (
    LABEL_DEVICE,
    LABEL_DRIVER,
    LABEL_NODE,
    VERSIONS,
    RuleSpec,
    rule_body,
    rule_labels,
    rule_name,
    rule_selector,
    spec_of,
    up_to_date,
)
from shared import telemetry
from shared.backoff import Backoff
from shared.errors import (
    KubeAlreadyExistsError,
    KubeError,
    KubeInvalidError,
    KubeNotFoundError,
    KubeTransientError,
    RecoverableError,
)
from shared.kube.client import KubeClient
from shared.kube.resources import RESOURCE_GROUP, ResourceType, device_taint_rules

__all__ = [
    "DRAIN_CAUSE",
    "LABEL_DEVICE",
    "LABEL_DRIVER",
    "LABEL_NODE",
    "RETRY_AFTER_CAP_S",
    "TARGETS",
    "VERSIONS",
    "RuleSpec",
    "TaintWriter",
    "rule_body",
    "rule_labels",
    "rule_name",
    "rule_selector",
    "spec_of",
]

log = structlog.get_logger(__name__)
tracer = telemetry.tracer(__name__)

DRAIN_CAUSE = "drain"
TARGETS = ("rule", "slice")
RETRY_AFTER_CAP_S = 5.0
"""The longest a 429's Retry-After holds back the next taint write; then it is tried again."""
_NONE = "None"
_FIRST_MINOR_WITH_NONE = 35
_MINOR = re.compile(r"^\d+")
_GIT_VERSION = re.compile(r"^v?1\.(\d+)")


class TaintWriter:
    """Keeps this node's DeviceTaintRules equal to the taints the policy wants."""

    def __init__(
        self,
        kube: KubeClient,
        *,
        driver: str,
        node: str,
        recheck_s: float = 300.0,
        target: str = "rule",
    ) -> None:
        """`target`: `rule` (write DeviceTaintRules) or `slice` (write none, delete ours)."""
        if target not in TARGETS:
            raise ValueError(f"taint target {target!r} is not one of {', '.join(TARGETS)}")
        self._kube = kube
        self._driver = driver
        self._node = node
        self._recheck_s = recheck_s
        self.target = target
        self.version: str | None = None
        self.answers_changed: Callable[[], None] = lambda: None
        """Called when what `applied` answers from changes (the evaluator's wake)."""
        self._available: bool | None = None
        self._none_supported: bool | None = None
        self._desired: dict[str, RuleSpec] = {}
        self._applied: dict[str, RuleSpec] = {}
        self._drains: dict[str, RuleSpec] = {}
        self._drains_touched: set[str] = set()
        self._pool = node
        self._contexts: dict[str, Context] = {}
        self._wanted = False
        self._reported = False
        self._changed = asyncio.Event()
        self._backoff = Backoff(initial_s=0.2, max_s=10.0, max_retry_after_s=RETRY_AFTER_CAP_S)

    @property
    def available(self) -> bool | None:
        """None until negotiated; False when no version serves devicetaintrules."""
        return self._available

    @available.setter
    def available(self, value: bool | None) -> None:
        if value != self._available:
            self._available = value
            self.answers_changed()

    @property
    def none_supported(self) -> bool | None:
        """False once the API server rejected a `None` effect (1.34); None: not known yet."""
        return self._none_supported

    @none_supported.setter
    def none_supported(self, value: bool | None) -> None:
        if value != self._none_supported:
            self._none_supported = value
            self.answers_changed()

    def want(
        self,
        taints: Mapping[str, Taint],
        *,
        pool: str,
        contexts: Mapping[str, Context] | None = None,
    ) -> None:
        """All taints this node's devices should carry now (by device); no I/O.

        `contexts` carries the trace of the transition behind a device's change.
        """
        self._pool = pool
        specs = (self._spec(device, taint, pool) for device, taint in sorted(taints.items()))
        desired = {spec.name: spec for spec in specs}
        self._contexts.update(contexts or {})
        if desired != self._desired or not self._wanted:
            self._desired, self._wanted = desired, True
            self._changed.set()

    def _spec(self, device: str, taint: Taint, pool: str) -> RuleSpec:
        name = rule_name(driver=self._driver, node=self._node, device=device, key=taint.key)
        return RuleSpec(
            name=name, driver=self._driver, node=self._node, pool=pool, device=device, taint=taint
        )

    @property
    def drain_key(self) -> str:
        return taint_key(self._driver, DRAIN_CAUSE)

    @property
    def drains(self) -> dict[str, str]:
        """Drained devices and their reasons."""
        return {spec.device: spec.note for spec in self._drains.values()}

    def drain_taint(self, device: str) -> Taint | None:
        """The drain taint of `device`; None when it is not drained."""
        spec = self._drains.get(device)
        return spec.taint if spec is not None else None

    def drain(self, device: str, *, reason: str, context: Context | None = None) -> None:
        """Give `device` the drain taint (NoSchedule), with `reason` on the rule; `context`:
        the trace of the request, which the rule's write continues."""
        if context is not None:
            self._contexts[device] = context
        self._drains[device] = self._drain_spec(device, reason)
        self._drains_touched.add(device)
        self._changed.set()

    def _drain_spec(self, device: str, reason: str, taint: Taint | None = None) -> RuleSpec:
        if taint is None:
            taint = Taint(key=self.drain_key, value=label_value(reason), effect="NoSchedule")
        spec = self._spec(device, taint, self._pool)
        return RuleSpec(
            name=spec.name,
            driver=spec.driver,
            node=spec.node,
            pool=spec.pool,
            device=device,
            taint=taint,
            note=reason,
        )

    def restore(self, device: str, taints: Iterable[Taint]) -> None:
        """Slice target: drain `device` again if the record an earlier run left says so.

        The record keeps only the taint (restored as it was), so the reason comes back as the
        taint's value. A device drained or undrained since the start keeps what was asked then;
        with target `rule` the rules are what persists drains, so this does nothing.
        """
        if self.target != "slice" or device in self._drains_touched or device in self._drains:
            return
        for taint in taints:
            if taint.key == self.drain_key:
                self._drains[device] = self._drain_spec(device, taint.value, taint)
                log.info("drain_restored", node=self._node, device=device, reason=taint.value)
                return

    def undrain(self, device: str, *, context: Context | None = None) -> bool:
        """Remove `device`'s drain taint; False when it was not drained."""
        if context is not None:
            self._contexts[device] = context
        self._drains_touched.add(device)
        found = self._drains.pop(device, None) is not None
        self._changed.set()
        return found

    def answers_from(self) -> tuple[object, ...]:
        """What `applied` and `drain_taint` answer from: while it stays equal, so do they (a
        caller can skip asking again)."""
        drains = tuple((spec.device, spec.taint) for spec in self._drains.values())
        return (self.target, self.available, self.none_supported, drains)

    def applied(self, taint: Taint | None) -> Taint | None:
        """`taint` as far as the cluster will see it: None while taint rules are unavailable
        (target `rule`), and None for a `None` taint where the server has no such effect."""
        if self.target == "rule" and self.available is False:
            return None
        if taint is not None and taint.effect == _NONE and self.none_supported is False:
            return None
        return taint

    async def run(self) -> None:
        """Eternal: negotiate, then converge after every change; retry recoverable errors."""
        while True:
            try:
                await self._step()
                self._backoff.reset()
            except RecoverableError as exc:
                # A 429's Retry-After is the least we wait, up to RETRY_AFTER_CAP_S: a taint
                # on a failing device must not wait minutes for an overloaded API server.
                retry_after = exc.retry_after_s if isinstance(exc, KubeTransientError) else None
                delay = self._backoff.next_delay(at_least_s=retry_after or 0.0)
                log.warning("taint_sync_failed", node=self._node, error=str(exc), retry_in_s=delay)
                self._changed.set()
                await asyncio.sleep(delay)

    async def _step(self) -> None:
        if self.available is not True:
            await self._negotiate()
        if not self.available:
            await asyncio.sleep(self._recheck_s)
            return
        await self._changed.wait()
        self._changed.clear()
        if self._wanted:
            await self._converge()

    async def _negotiate(self) -> None:
        """Pick the preferred version that serves devicetaintrules and adopt our rules."""
        if self.target == "slice" and self.none_supported is None:
            await self._learn_effects()
        try:
            served = await self._kube.served_versions(RESOURCE_GROUP)
            for version in (v for v in VERSIONS if v in served):
                if await self._adopt(version):
                    return
            reason = f"no version of {RESOURCE_GROUP} {served} serves devicetaintrules"
        except KubeError as exc:  # e.g. 403: RBAC does not let us list them
            reason = str(exc)
        self.version, self.available = None, False
        if not self._reported:
            # With target `slice` no rule is needed: there is just nothing left to clean up.
            report = log.error if self.target == "rule" else log.info
            report("taint_rules_unavailable", node=self._node, reason=reason, target=self.target)
            self._reported = True

    async def _learn_effects(self) -> None:
        """Slice target: whether the server's ResourceSlices take the `None` effect (1.35+)."""
        try:
            minor = _minor_of(await self._kube.get_path("/version"))
        except KubeError as exc:
            log.warning("server_version_unreadable", node=self._node, error=str(exc))
            return
        if minor is not None:
            self.none_supported = minor >= _FIRST_MINOR_WITH_NONE
            log.info("taint_effects_known", node=self._node, none=self.none_supported)

    async def _adopt(self, version: str) -> bool:
        """Use `version` if it serves devicetaintrules, starting from the rules we own there."""
        selector = rule_selector(driver=self._driver, node=self._node)
        try:
            found = await self._kube.list(device_taint_rules(version), label_selector=selector)
        except KubeNotFoundError:
            return False  # the group version is served, but without devicetaintrules
        items = found.get("items") or []
        self._applied = {s.name: s for s in (spec_of(o, node=self._node) for o in items)}
        for spec in self._applied.values():
            if spec.taint.key == self.drain_key and spec.device not in self._drains_touched:
                self._drains[spec.device] = spec
                log.info("drain_restored", node=self._node, device=spec.device, reason=spec.note)
        self.version, self.available = version, True
        log.info("taint_rules_negotiated", node=self._node, version=version, found=len(items))
        self._changed.set()
        return True

    async def _converge(self) -> None:
        assert self.version is not None
        rt = device_taint_rules(self.version)
        # Traces of the transitions behind this pass; kept for a retry if the pass stops early.
        contexts, self._contexts = self._contexts, {}
        done = False
        try:
            desired = self._wanted_now()
            # New and changed taints first: a fault must not wait behind removals.
            names = sorted(set(desired) | set(self._applied), key=lambda n: (n not in desired, n))
            for name in names:
                want, have = desired.get(name), self._applied.get(name)
                if want is not None and want.taint.effect == _NONE and self.none_supported is False:
                    want = None  # learned during this pass: the server has no None effect
                if want is None and self._changed.is_set():
                    return  # news came in: start over, so its taints go before removals
                if want != have and not await self._traced_write(rt, want, have, contexts):
                    return
            done = True
        finally:
            if not done:
                self._contexts = {**contexts, **self._contexts}

    def _wanted_now(self) -> dict[str, RuleSpec]:
        """Fault and drain rules, less `None` taints where the server has no such effect;
        none at all with target `slice`."""
        if self.target == "slice":
            return {}
        desired = {**self._desired, **{s.name: s for s in self._drains.values()}}
        if self.none_supported is False:
            return {n: s for n, s in desired.items() if s.taint.effect != _NONE}
        return desired

    async def _traced_write(
        self,
        rt: ResourceType,
        want: RuleSpec | None,
        have: RuleSpec | None,
        contexts: Mapping[str, Context],
    ) -> bool:
        spec = want or have
        assert spec is not None
        with tracer.start_as_current_span(
            "health.write_taint",
            context=contexts.get(spec.device),
            attributes={"device": spec.device, "rule": spec.name, "delete": want is None},
        ):
            return await self._write(rt, want=want, have=have)

    async def _write(
        self, rt: ResourceType, *, want: RuleSpec | None, have: RuleSpec | None
    ) -> bool:
        """Make one rule right; False when the version went away (renegotiate)."""
        try:
            if want is None:
                assert have is not None
                await self._delete(rt, have)
                self._applied.pop(have.name, None)
            else:
                await self._apply(rt, want)
                self._applied[want.name] = want
        except KubeNotFoundError as exc:
            log.warning("taint_rules_vanished", node=self._node, error=str(exc))
            self.available, self.version = None, None
            self._changed.set()
            return False
        except KubeInvalidError as exc:
            if want is None or want.taint.effect != _NONE or self.none_supported is not None:
                return self._rejected(want, have, exc)
            self.none_supported = False
            log.warning("taint_effect_none_unsupported", node=self._node, error=str(exc))
        except KubeError as exc:
            return self._rejected(want, have, exc)
        else:
            if want is not None and want.taint.effect == _NONE:
                self.none_supported = True
        return True

    def _rejected(self, want: RuleSpec | None, have: RuleSpec | None, exc: KubeError) -> bool:
        spec = want or have
        assert spec is not None
        log.error("taint_rule_rejected", node=self._node, device=spec.device, error=str(exc))
        # A definite refusal will not change on retry: remember it as done until it changes.
        if want is None:
            self._applied.pop(spec.name, None)
        else:
            self._applied[spec.name] = want
        return True

    async def _apply(self, rt: ResourceType, spec: RuleSpec) -> None:
        try:
            await self._kube.create(rt, rule_body(spec, version=rt.version))
            log.info("taint_rule_created", node=self._node, device=spec.device, rule=spec.name)
            return
        except KubeAlreadyExistsError:
            pass
        current = await self._kube.get(rt, spec.name)
        if up_to_date(current, spec):
            return
        old = spec_of(current, node=self._node).taint
        kept = ((current.get("spec") or {}).get("taint") or {}).get("timeAdded", "")
        body = rule_body(spec, version=rt.version, time_added=kept if old == spec.taint else "")
        body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        await self._kube.replace(rt, body)
        log.info("taint_rule_updated", node=self._node, device=spec.device, rule=spec.name)

    async def _delete(self, rt: ResourceType, spec: RuleSpec) -> None:
        try:
            await self._kube.delete(rt, spec.name)
        except KubeNotFoundError:
            return  # already gone: the wanted state
        log.info("taint_rule_deleted", node=self._node, device=spec.device, rule=spec.name)


def _minor_of(version: Mapping[str, Any]) -> int | None:
    """The minor version of a Kubernetes 1.x `/version` answer (`"35"`, `"35+"`, gitVersion)."""
    if str(version.get("major", "1")).strip("+") not in ("", "1"):
        return None
    if match := _MINOR.match(str(version.get("minor", ""))):
        return int(match.group())
    if match := _GIT_VERSION.match(str(version.get("gitVersion", ""))):
        return int(match.group(1))
    return None
