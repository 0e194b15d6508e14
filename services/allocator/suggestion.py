"""The one change that would make a claim fit on a node, when there is one (pure).

Candidate edits come from the node's exclusions, each tried alone with the allocator itself:
tolerate a taint that blocks devices, drop a constraint that conflicts, lower a request's count
to the candidates there are, drop a request's capacity requests, drop a claim selector that
excludes devices, or free the devices another claim holds. The first edit under which the
claim fits is the answer, in that order (the author's own changes before evicting another
claim); "" when no single edit does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

from services.allocator.allocator import Attempt, Cluster
from services.allocator.errors import AllocatorError
from services.allocator.exclusion import Rule
from services.allocator.node_report import DeviceVerdict, NodeReport
from services.allocator.request import Alternative, ClaimSpec, Request

__all__ = ["suggest"]

Edit = tuple[str, ClaimSpec, Cluster]
"""(what to tell the user, the edited claim, the edited cluster)."""


def suggest(cluster: Cluster, claim: ClaimSpec, *, node: str, report: NodeReport) -> str:
    for change, edited_claim, edited_cluster in _edits(cluster, claim, report):
        try:
            if Attempt(edited_cluster, edited_claim, node=node).run():
                return change
        except AllocatorError:
            continue
    return ""


def _edits(cluster: Cluster, claim: ClaimSpec, report: NodeReport) -> Iterator[Edit]:
    """Edits in order of preference: what the claim's intent survives best first."""
    seen: set[tuple[Any, ...]] = set()
    by_rule: dict[str, list[Edit]] = {rule: [] for rule in _PREFERENCE}
    for alt_report in report.requests:
        for verdict in alt_report.devices:
            edit = _from_exclusion(cluster, claim, alt_report.name, verdict)
            if edit is not None and edit[0] not in seen:
                seen.add(edit[0])
                by_rule[verdict.exclusion.rule].append(edit[1])
    for alt_report in report.requests:
        needed = alt_report.needed
        if needed is not None and 0 < alt_report.candidates < needed:
            change = (
                f"lower the count of request {alt_report.name} from {needed} "
                f"to {alt_report.candidates}"
            )
            edited = _edit(claim, alt_report.name, count=alt_report.candidates)
            by_rule["count"].append((change, edited, cluster))
        if any(v.exclusion.rule == Rule.CAPACITY for v in alt_report.devices):
            change = f"ask request {alt_report.name} for less capacity (or none)"
            by_rule[Rule.CAPACITY].append(
                (change, _edit(claim, alt_report.name, capacity={}), cluster)
            )
    for rule in _PREFERENCE:
        yield from by_rule[rule]


# What the claim's author can change comes first (a toleration, a constraint, the count, the
# capacity, a selector); freeing devices another claim holds means evicting someone else's
# pods, so it is the last resort.
_PREFERENCE = (
    Rule.TAINT,
    Rule.CONSTRAINT,
    "count",
    Rule.CAPACITY,
    Rule.CLAIM_SELECTOR,
    Rule.ALLOCATED,
)


def _from_exclusion(
    cluster: Cluster, claim: ClaimSpec, name: str, verdict: DeviceVerdict
) -> tuple[tuple[Any, ...], Edit] | None:
    """(what identifies the edit, the edit) that lifts this device's exclusion, if any."""
    rule, detail = verdict.exclusion.rule, verdict.exclusion.detail
    request = name.split("/", 1)[0]
    if rule == Rule.TAINT:
        taint = detail["taint"]
        mark: tuple[Any, ...] = ("taint", request, taint.get("key"), taint.get("effect"))
        return mark, _tolerate(cluster, claim, request, taint)
    if rule == Rule.ALLOCATED:
        holdings = cluster.holdings.without(detail["claim"])
        change = f"deallocate claim {detail['claim']}, which holds {verdict.device}"
        edit = (change, claim, dataclasses.replace(cluster, holdings=holdings))
        return ("claim", detail["claim"]), edit
    if rule == Rule.CLAIM_SELECTOR:
        mark = ("selector", name, detail["selector"])
        return mark, _drop_selector(cluster, claim, name, detail["selector"])
    if rule == Rule.CONSTRAINT:
        return ("constraint", detail["constraint"]), _drop_constraint(
            cluster, claim, detail["constraint"]
        )
    return None


def _tolerate(cluster: Cluster, claim: ClaimSpec, request: str, taint: dict[str, Any]) -> Edit:
    toleration = {"key": taint.get("key"), "operator": "Exists", "effect": taint.get("effect")}
    change = (
        f"add to request {request} the toleration {{key: {taint.get('key')}, "
        f"operator: Exists, effect: {taint.get('effect')}}}"
    )

    def tolerate(alt: Alternative) -> Alternative:
        return dataclasses.replace(alt, tolerations=(*alt.tolerations, toleration))

    return change, _map(claim, lambda alt: alt.request == request, tolerate), cluster


def _drop_selector(cluster: Cluster, claim: ClaimSpec, name: str, index: int) -> Edit:
    def drop(alt: Alternative) -> Alternative:
        return dataclasses.replace(
            alt, selectors=tuple(s for i, s in enumerate(alt.selectors) if i != index)
        )

    change = f"relax selector #{index} of request {name}: it excludes devices the node has"
    return change, _map(claim, lambda alt: alt.name == name, drop), cluster


def _drop_constraint(cluster: Cluster, claim: ClaimSpec, index: int) -> Edit:
    raw = claim.constraints[index]
    kind = "matchAttribute" if raw.get("matchAttribute") else "distinctAttribute"
    change = f"drop constraint #{index} ({kind} {raw.get(kind)})"
    kept = tuple(c for i, c in enumerate(claim.constraints) if i != index)
    return change, dataclasses.replace(claim, constraints=kept), cluster


def _edit(claim: ClaimSpec, name: str, **changes: Any) -> ClaimSpec:
    return _map(claim, lambda alt: alt.name == name, lambda a: dataclasses.replace(a, **changes))


def _map(
    claim: ClaimSpec,
    which: Callable[[Alternative], bool],
    change: Callable[[Alternative], Alternative],
) -> ClaimSpec:
    requests = tuple(
        Request(r.name, tuple(change(a) if which(a) else a for a in r.alternatives))
        for r in claim.requests
    )
    return dataclasses.replace(claim, requests=requests)
