"""Why a claim fits a node or not, node by node, and the one change that would make it fit
(pure).

Per node, a `NodeReport` (node_report.py). When the claim fits nowhere, the closest node is the
one with the fewest devices missing, and the suggested change is the first of a few single edits
(tolerate a taint, free another claim's devices, drop a claim selector or a constraint, lower a
count, drop a capacity request) under which the allocator itself says the claim fits there
(suggestion.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from services.allocator.allocator import Attempt, Cluster
from services.allocator.errors import SelectorError, UnsatisfiableError
from services.allocator.node_report import NodeReport, explain_node
from services.allocator.request import ClaimSpec
from services.allocator.result import AllocationResult
from services.allocator.suggestion import suggest

__all__ = [
    "Explanation",
    "PodExplanation",
    "PodNodeReport",
    "explain",
    "explain_pod",
    "selects_driver",
]


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
    reason: str = ""
    """Why the claims do not fit here: the first claim that does not fit alone (and what it
    lacks), or that each fits alone but not all together."""


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
        if not fits:
            reports.append(
                PodNodeReport(node, False, reason=_why_not_together(cluster, claims, node))
            )
            continue
        allocation = tuple(
            (claim.ref, tuple(attempt.results(claim=i))) for i, claim in enumerate(claims)
        )
        reports.append(PodNodeReport(node, True, allocation))
    return PodExplanation(pod, tuple(c.ref for c in claims), tuple(reports))


def _why_not_together(cluster: Cluster, claims: Sequence[ClaimSpec], node: str) -> str:
    for claim in claims:
        report = explain_node(cluster, claim, node=node)
        if report.error:
            return f"claim {claim.ref}: {report.error}"
        if not report.fits:
            short = "; ".join(
                f"request {r.name} needs {'all' if r.needed is None else r.needed}, "
                f"{r.candidates} candidate{'s' if r.candidates != 1 else ''}"
                for r in report.requests
                if r.needed is None or r.candidates < r.needed
            )
            return f"claim {claim.ref} does not fit here alone" + (f" ({short})" if short else "")
    return "each claim fits alone, but not all of them together (they need the same devices)"
