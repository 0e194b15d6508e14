"""One claim allocated on one node, first fit, as kube-scheduler's structured allocator does it
(pure).

Requests are taken in order; for each, its alternatives in order (the first that can be
satisfied wins); for each alternative, devices in pool, slice-name and device order, trying
combinations (never permutations) and backtracking into earlier picks when a later request
cannot be satisfied. A device is checked in upstream's order: held by another claim (or picked
in this claim), class then claim selectors, capacity, shared counters, taints against the
request's tolerations, then the claim's constraints. Incomplete and invalid pools are skipped;
a request for `All` devices fails while any pool is incomplete or invalid. A CEL runtime error
stops the node's allocation (SelectorError), as in Kubernetes. At most 32 results per claim.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from services.allocator import capacity, taint
from services.allocator.capacity import Consumption
from services.allocator.cluster import Cluster
from services.allocator.constraint import Constraint
from services.allocator.device import Device, DeviceKey, device_id
from services.allocator.errors import SelectorError, UnsatisfiableError
from services.allocator.exclusion import Exclusion, Rule
from services.allocator.pool import Inventory, Pool
from services.allocator.request import Alternative, ClaimSpec, read_claim
from services.allocator.result import AllocationResult, Holdings
from shared import quantity

__all__ = ["MAX_RESULTS", "MAX_STEPS", "Attempt", "Cluster", "Pick", "allocate", "new_share_id"]

Obj = dict[str, Any]
MAX_RESULTS = 32
MAX_STEPS = 100_000
"""Devices tried per attempt before giving up: the search is exponential in the worst case,
and kube-scheduler bounds it too (its DRA filter times out)."""


def new_share_id() -> str:
    return str(uuid.uuid4())


@dataclass(frozen=True, slots=True)
class Pick:
    alternative: Alternative
    device: Device
    consumed: Consumption | None = None
    """What a share takes of a multi-allocatable device; None for a device taken whole."""
    claim: int = 0
    """Which of the attempt's claims the device is for."""


class Attempt:
    """The allocation of one claim (or of a pod's claims together, `also`) on one node;
    `run()` once, or `exclusion()` to diagnose."""

    def __init__(
        self,
        cluster: Cluster,
        claim: ClaimSpec,
        *,
        node: str | None,
        holdings: Holdings | None = None,
        also: Sequence[ClaimSpec] = (),
    ) -> None:
        self.cluster = cluster
        self.claim = claim
        self.claims = (claim, *also)
        self.node = node
        self.holdings = holdings if holdings is not None else cluster.holdings
        self.pools: list[Pool] = cluster.inventory.pools(node)
        self.devices = [d for p in self.pools if p.usable for d in p.devices]
        self.picks: list[Pick] = []
        self.chosen: dict[tuple[int, str], Alternative] = {}
        """(claim index, request name) -> the alternative that was allocated."""
        self._constraints = [c.fresh_constraints() for c in self.claims]
        self.constraints: list[Constraint] = self._constraints[0]
        self.trace: dict[tuple[str, DeviceKey], Exclusion] = {}
        self._requests = [(i, r) for i, c in enumerate(self.claims) for r in c.requests]
        self._claim_of = {id(alt): i for i, r in self._requests for alt in r.alternatives}
        self._whole: dict[DeviceKey, tuple[int, str]] = {}
        self._sharing: dict[DeviceKey, dict[str, Decimal]] = {}
        held = self.holdings.held_devices(p.key for p in self.pools)
        self._ledger = cluster.inventory.counters.ledger(held)
        self._alt_keys: dict[int, tuple[Any, ...]] = {}
        self._steps = 0

    # --- the search -------------------------------------------------------------------------

    def run(self) -> bool:
        """Whether the claim fits; then `picks` holds the allocation."""
        return self._request(0)

    def results(
        self, share_ids: Callable[[], str] = new_share_id, *, claim: int = 0
    ) -> list[AllocationResult]:
        """The results of the attempt's first claim (or of `claim`, by index)."""
        return [_result(p, share_ids) for p in self.picks if p.claim == claim]

    def _request(self, index: int) -> bool:
        if index == len(self._requests):
            return True
        claim, request = self._requests[index]
        for alternative in request.alternatives:
            if self._fill(index, alternative, 0, 0):
                self.chosen[(claim, alternative.request)] = alternative
                return True
        return False

    def _fill(self, index: int, alt: Alternative, done: int, start: int) -> bool:
        if alt.all_devices:
            return self._fill_all(index, alt, done)
        if done == alt.count:
            return self._request(index + 1)
        if len(self.picks) + alt.count - done > MAX_RESULTS:
            return False
        for position in range(start, len(self.devices)):
            undo = self._take(alt, self.devices[position])
            if undo is None:
                continue
            if self._fill(index, alt, done + 1, position + 1):
                return True
            undo()
        return False

    def _fill_all(self, index: int, alt: Alternative, done: int) -> bool:
        devices = self.all_devices(alt)
        if not devices or len(self.picks) + len(devices) - done > MAX_RESULTS:
            return False
        if done == len(devices):
            return self._request(index + 1)
        undo = self._take(alt, devices[done])
        if undo is None:
            return False
        if self._fill_all(index, alt, done + 1):
            return True
        undo()
        return False

    def all_devices(self, alt: Alternative) -> list[Device]:
        """The devices an `All` request needs: every selectable device of the node with the
        capacity asked for; UnsatisfiableError while a pool is incomplete or invalid."""
        for pool in self.pools:
            state = "currently being updated" if pool.incomplete else "currently invalid"
            if not pool.usable:
                raise UnsatisfiableError(
                    f"claim {self._ref(alt)}, request {alt.name}: asks for all devices, "
                    f"but resource pool {pool.driver}/{pool.name} is {state}"
                )
        selected = []
        for device in self.devices:
            found = self._selected(alt, device)
            if isinstance(found, Exclusion) and found.rule == Rule.CEL_ERROR:
                raise SelectorError(found.message, device=device_id(device.key))
            if not isinstance(found, Exclusion):
                selected.append(device)
        return selected

    # --- one device -------------------------------------------------------------------------

    def exclusion(self, alt: Alternative, device: Device) -> Exclusion | None:
        """The first rule that keeps `device` from `alt` in the current state, or None."""
        found = self._check(alt, device)
        return found if isinstance(found, Exclusion) else None

    def _take(self, alt: Alternative, device: Device) -> Callable[[], None] | None:
        self._steps += 1
        if self._steps > MAX_STEPS:
            raise UnsatisfiableError(
                f"claim {self._ref(alt)}: gave up after trying {MAX_STEPS} devices "
                "(the scheduler's allocation times out on such a claim too)"
            )
        found = self._check(alt, device)
        if isinstance(found, Exclusion):
            if found.rule == Rule.CEL_ERROR:
                raise SelectorError(found.message, device=device_id(device.key))
            self.trace.setdefault((alt.name, device.key), found)
            return None
        conflict = self._constrain(alt, device)
        if conflict is not None:
            self.trace.setdefault((alt.name, device.key), conflict)
            return None
        return self._hold(alt, device, found)

    def _hold(self, alt: Alternative, device: Device, found: Consumption) -> Callable[[], None]:
        """Count `device` as picked for `alt`; the returned function undoes it."""
        shared = device.multiple_allocations
        claim = self._claim_of.get(id(alt), 0)
        self.picks.append(Pick(alt, device, found if shared else None, claim))
        if shared:
            using = self._sharing.setdefault(device.key, {})
            for name, amount in found.items():
                using[name] = using.get(name, Decimal(0)) + amount
        else:
            self._whole[device.key] = (claim, alt.name)
        self._ledger.take(device.key)

        def undo() -> None:
            self.picks.pop()
            for constraint in self._constraints[claim]:
                constraint.remove(alt.request, alt.subrequest, device)
            if shared:
                for name, amount in found.items():
                    self._sharing[device.key][name] -= amount
                if not any(self._sharing[device.key].values()):
                    del self._sharing[device.key]
            else:
                del self._whole[device.key]
            self._ledger.give(device.key)

        return undo

    def _check(self, alt: Alternative, device: Device) -> Exclusion | Consumption:
        key = device.key
        holder = self._whole.get(key)
        claim = self._claim_of.get(id(alt), 0)
        if holder is not None and (not alt.admin_access or holder[0] == claim):
            of = f" of claim {self.claims[holder[0]].ref}" if holder[0] != claim else ""
            return Exclusion(Rule.PICKED, f"already picked for request {holder[1]}{of}")
        if not alt.admin_access and key in self.holdings.whole:
            other = self.holdings.whole[key]
            return Exclusion(Rule.ALLOCATED, f"allocated to claim {other}", {"claim": other})
        selected = self._selected(alt, device)
        if isinstance(selected, Exclusion):
            return selected
        if device.multiple_allocations:
            used = dict(self.holdings.shared.get(key, {}))
            for name, amount in self._sharing.get(key, {}).items():
                used[name] = used.get(name, Decimal(0)) + amount
            short = capacity.shortage(device, selected, used)
            if short:
                return Exclusion(Rule.CAPACITY, short)
            sharing = key in self.holdings.shared or key in self._sharing
        else:
            sharing = False
        if not sharing:
            short = self._ledger.shortage(key)
            if short:
                return Exclusion(Rule.COUNTERS, short)
        blocking = taint.blocking_taint(self.cluster.taint_rules.taints(device), alt.tolerations)
        if blocking is not None:
            return Exclusion(Rule.TAINT, _taint_message(blocking), {"taint": blocking})
        return selected

    def _selected(self, alt: Alternative, device: Device) -> Exclusion | Consumption:
        """Selectors and the capacity the device has (what does not change during a run);
        shared by every attempt on the cluster for devices of the same content."""
        cache_key = (self._alt_key(alt), self.cluster.cel.fingerprint(device))
        found = self.cluster.static.get(cache_key)
        if found is None:
            found = self._select(alt, device)
            if isinstance(found, Exclusion) and found.rule == Rule.CEL_ERROR:
                return found  # names the device: not shared
            self.cluster.static[cache_key] = found
        return found

    def _alt_key(self, alt: Alternative) -> tuple[Any, ...]:
        key = self._alt_keys.get(id(alt))
        if key is None:
            key = self._alt_keys[id(alt)] = (
                alt.device_class,
                alt.class_selectors,
                alt.selectors,
                tuple(sorted(alt.capacity.items())),
            )
        return key

    def _select(self, alt: Alternative, device: Device) -> Exclusion | Consumption:
        for kind, expressions in (("class", alt.class_selectors), ("claim", alt.selectors)):
            for i, expression in enumerate(expressions):
                outcome = self.cluster.cel.evaluate(expression, device)
                if outcome.error:
                    where = (
                        f"class {alt.device_class}"
                        if kind == "class"
                        else f"claim {self._ref(alt)}"
                    )
                    message = (
                        f"{where}: selector #{i} on device {device_id(device.key)}: "
                        f"CEL runtime error: {outcome.error}"
                    )
                    return Exclusion(Rule.CEL_ERROR, message, {"kind": kind, "selector": i})
                if not outcome.matches:
                    rule = Rule.CLASS_SELECTOR if kind == "class" else Rule.CLAIM_SELECTOR
                    what = f"class {alt.device_class}" if kind == "class" else "claim"
                    return Exclusion(rule, f"{what} selector #{i} is false", {"selector": i})
        taken = capacity.consumption(device, alt.capacity)
        if isinstance(taken, str):
            return Exclusion(Rule.CAPACITY, taken)
        return taken

    def _ref(self, alt: Alternative) -> str:
        return self.claims[self._claim_of.get(id(alt), 0)].ref

    def _constrain(self, alt: Alternative, device: Device) -> Exclusion | None:
        claim = self._claim_of.get(id(alt), 0)
        constraints = self._constraints[claim]
        for position, constraint in enumerate(constraints):
            if constraint.add(alt.request, alt.subrequest, device):
                continue
            for earlier in constraints[:position]:
                earlier.remove(alt.request, alt.subrequest, device)
            others = [
                p.alternative.name
                for p in self.picks
                if p.claim == claim
                and constraint.applies(p.alternative.request, p.alternative.subrequest)
            ]
            with_what = f" with request {others[0]}" if others else ""
            conflict = constraint.conflict(device)
            message = f"constraint {constraint.describe()} conflicts{with_what}: {conflict}"
            return Exclusion(Rule.CONSTRAINT, message, {"constraint": constraint.index})
        return None


def _taint_message(blocking: Mapping[str, Any]) -> str:
    value = f"={blocking['value']}" if blocking.get("value") else ""
    rule = f" (DeviceTaintRule {blocking['rule']})" if blocking.get("rule") else ""
    return f"tainted {blocking.get('key')}{value}:{blocking.get('effect')} without toleration{rule}"


def _result(pick: Pick, share_ids: Callable[[], str]) -> AllocationResult:
    device, alt = pick.device, pick.alternative
    common: dict[str, Any] = {
        "request": alt.name,
        "driver": device.driver,
        "pool": device.pool,
        "device": device.name,
        "admin_access": alt.admin_access,
        "tolerations": alt.tolerations,
    }
    if pick.consumed is None:
        return AllocationResult(**common)
    return AllocationResult(
        **common,
        share_id=share_ids(),
        consumed_capacity={
            device.capacity_names.get(name, name): quantity.exact(amount)
            for name, amount in sorted(pick.consumed.items())
        },
    )


def allocate(
    claim: Mapping[str, Any],
    *,
    classes: Mapping[str, Obj],
    slices: Sequence[Obj],
    in_use: Sequence[AllocationResult] = (),
    taint_rules: Sequence[Obj] = (),
    node: str | None = None,
    share_ids: Callable[[], str] = new_share_id,
) -> list[AllocationResult]:
    """First-fit allocation of the claim on `node` (None: every slice given is the node's);
    UnsatisfiableError when nothing fits, SelectorError on a CEL error, ClaimError on a claim
    that cannot be allocated as written.

    `in_use`: results of other claims (`allocated_results`), which hold their devices and
    shares; `share_ids` makes the shareID of each new share (lower-case UUIDs by default).
    """
    cluster = Cluster(
        inventory=Inventory(slices),
        classes=classes,
        taint_rules=taint.TaintRules(taint_rules),
        holdings=Holdings.of(in_use),
    )
    spec = read_claim(claim, classes)
    attempt = Attempt(cluster, spec, node=node)
    if attempt.run():
        return attempt.results(share_ids)
    names = ", ".join(r.name for r in spec.requests)
    invalid = "".join(
        f"; pool {p.name} of {p.driver} is {state}: {why}"
        for p in attempt.pools
        for state, why in (("incomplete", p.incomplete), ("invalid", p.invalid))
        if why
    )
    raise UnsatisfiableError(f"no devices satisfy requests {names} with their constraints{invalid}")
