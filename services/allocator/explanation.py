"""Why a claim fits a node or not, node by node, and the one change that would make it fit
(pure).

Per node: the allocation the allocator makes when the claim fits; otherwise, per request (and
per alternative of a `firstAvailable` request), every device the node sees with the first rule
that excluded it, in the allocator's own order (`Rule`), and how many candidates are left. When
the claim fits nowhere, the closest node is the one with the fewest devices missing, and the
suggested change is the first of a few single edits (tolerate a taint, free another claim's
devices, drop a claim selector or a constraint, lower a count, drop a capacity request) under
which the allocator itself says the claim fits there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from services.allocator.allocator import Attempt, Cluster
from services.allocator.device import device_id
from services.allocator.errors import SelectorError, UnsatisfiableError
from services.allocator.exclusion import Exclusion, Rule
from services.allocator.request import Alternative, ClaimSpec
from services.allocator.result import AllocationResult
from services.allocator.suggestion import suggest

__all__ = [
    "AlternativeReport",
    "DeviceVerdict",
    "Explanation",
    "NodeReport",
    "PodExplanation",
    "PodNodeReport",
    "explain",
    "explain_pod",
    "selects_driver",
]


@dataclass(frozen=True, slots=True)
class DeviceVerdict:
    device: str
    """`driver/pool/device`."""
    exclusion: Exclusion


@dataclass(frozen=True, slots=True)
class AlternativeReport:
    name: str
    """`request` or `request/subrequest`."""
    needed: int | None
    """Devices wanted; None for `All`."""
    candidates: int
    """Devices that pass every rule that does not depend on the claim's other picks."""
    devices: tuple[DeviceVerdict, ...] = ()
    skipped: str = ""
    """Set when the alternative was not tried because an earlier one fit."""


@dataclass(frozen=True, slots=True)
class NodeReport:
    node: str
    fits: bool
    allocation: tuple[AllocationResult, ...] = ()
    requests: tuple[AlternativeReport, ...] = ()
    error: str = ""
    """A CEL runtime error, or an `All` request over an incomplete pool: the node fails."""
    missing: int = 0
    """How many devices the node is short of (0 when the claim fails on a conflict)."""


@dataclass(frozen=True, slots=True)
class Explanation:
    claim: str
    nodes: tuple[NodeReport, ...]
    closest: str = ""
    change: str = ""
    """The one change that makes the claim fit on the closest node, when there is one."""
    warnings: tuple[str, ...] = field(default_factory=tuple)

    @property
    def fits(self) -> bool:
        return any(n.fits for n in self.nodes)


def explain(cluster: Cluster, claim: ClaimSpec, *, nodes: Sequence[str]) -> Explanation:
    reports = tuple(explain_node(cluster, claim, node=node) for node in nodes)
    if any(r.fits for r in reports) or not reports:
        return Explanation(claim.ref, reports)
    closest = min(reports, key=lambda r: (bool(r.error), r.missing, r.node))
    change = "" if closest.error else suggest(cluster, claim, node=closest.node, report=closest)
    return Explanation(claim.ref, reports, closest=closest.node, change=change)


def explain_node(cluster: Cluster, claim: ClaimSpec, *, node: str) -> NodeReport:
    attempt = Attempt(cluster, claim, node=node)
    try:
        fits = attempt.run()
    except (SelectorError, UnsatisfiableError) as exc:
        return NodeReport(node, False, error=str(exc), missing=0)
    if fits:
        return NodeReport(
            node,
            True,
            allocation=tuple(attempt.results()),
            requests=tuple(_skipped(claim, attempt)),
        )
    requests = []
    missing = 0
    for request in claim.requests:
        reports = [_alternative(attempt, alt) for alt in request.alternatives]
        requests.extend(reports)
        missing += min(_short(r) for r in reports)
    return NodeReport(node, False, requests=tuple(requests), missing=missing)


def _short(report: AlternativeReport) -> int:
    if report.needed is None:
        return 0 if report.candidates else 1
    return max(0, report.needed - report.candidates)


def _skipped(claim: ClaimSpec, attempt: Attempt) -> list[AlternativeReport]:
    """Alternatives of a fitting claim that were not used: the ones tried before the chosen
    one (why each failed, as if nothing were picked yet) and the ones never tried."""
    fresh = Attempt(attempt.cluster, claim, node=attempt.node, holdings=attempt.holdings)
    reports = []
    for request in claim.requests:
        chosen = attempt.chosen.get((0, request.name))
        if chosen is None or len(request.alternatives) == 1:
            continue
        later = False
        for alt in request.alternatives:
            if alt is chosen:
                later = True
                continue
            if later:
                why = f"alternative {chosen.name} fit first"
                reports.append(AlternativeReport(alt.name, _needed(alt), 0, skipped=why))
            else:
                reports.append(_alternative(fresh, alt, trace=attempt.trace))
    return reports


def _needed(alt: Alternative) -> int | None:
    return None if alt.all_devices else alt.count


def _alternative(
    attempt: Attempt, alt: Alternative, *, trace: Mapping[Any, Exclusion] | None = None
) -> AlternativeReport:
    """Each device's first exclusion with nothing of the claim picked (a failed run undoes
    every pick), then what the search ran into (`trace`: the attempt's own by default)."""
    trace = attempt.trace if trace is None else trace
    verdicts: list[tuple[str, Exclusion | None]] = []
    candidates = 0
    for pool in attempt.pools:
        for device in pool.devices:
            found: Exclusion | None
            if pool.incomplete:
                found = Exclusion(Rule.POOL_INCOMPLETE, f"pool incomplete: {pool.incomplete}")
            elif pool.invalid:
                found = Exclusion(Rule.POOL_INVALID, f"pool invalid: {pool.invalid}")
            else:
                found = attempt.exclusion(alt, device)
            if found is None:
                candidates += 1
                found = trace.get((alt.name, device.key))
            verdicts.append((device_id(device.key), found))
    needed = _needed(alt)
    if needed is not None and candidates < needed:
        usable = f"a candidate, but only {candidates} of the {needed} devices wanted are"
    else:
        usable = "a candidate; the claim fails on another request or rule"
    return AlternativeReport(
        alt.name,
        needed,
        candidates,
        tuple(DeviceVerdict(d, e or Exclusion(Rule.CANDIDATE, usable)) for d, e in verdicts),
    )


def selects_driver(cluster: Cluster, claim: ClaimSpec, *, driver: str) -> bool | None:
    """Whether some device class of the claim selects a device of `driver` anywhere; None
    when the cluster has no device of that driver (nothing to tell)."""
    devices = [d for d in cluster.inventory.devices() if d.driver == driver]
    if not devices:
        return None
    for request in claim.requests:
        for alt in request.alternatives:
            for device in devices:
                outcomes = (cluster.cel.evaluate(e, device) for e in alt.class_selectors)
                if all(o.matches or o.error for o in outcomes):
                    return True
    return False


@dataclass(frozen=True, slots=True)
class PodNodeReport:
    node: str
    fits: bool
    allocation: tuple[tuple[str, tuple[AllocationResult, ...]], ...] = ()
    """(claim, its results) for each claim of the pod, when they fit together."""
    error: str = ""


@dataclass(frozen=True, slots=True)
class PodExplanation:
    """Whether a pod's claims fit together, node by node: kube-scheduler allocates every
    claim of a pod on one node in one go, so claims that each fit may not fit together."""

    pod: str
    claims: tuple[str, ...]
    nodes: tuple[PodNodeReport, ...]

    @property
    def fits(self) -> bool:
        return any(n.fits for n in self.nodes)


def explain_pod(
    cluster: Cluster, pod: str, claims: Sequence[ClaimSpec], *, nodes: Sequence[str]
) -> PodExplanation:
    reports = []
    for node in nodes:
        attempt = Attempt(cluster, claims[0], node=node, also=claims[1:])
        try:
            fits = attempt.run()
        except (SelectorError, UnsatisfiableError) as exc:
            reports.append(PodNodeReport(node, False, error=str(exc)))
            continue
        allocation = tuple(
            (claim.ref, tuple(attempt.results(claim=i))) for i, claim in enumerate(claims)
        )
        reports.append(PodNodeReport(node, fits, allocation if fits else ()))
    return PodExplanation(pod, tuple(c.ref for c in claims), tuple(reports))
