"""Why a claim fits one node or not (pure).

When the claim fits: the allocation the allocator makes, and why each alternative of a
`firstAvailable` request before the chosen one did not. Otherwise, per request (and per
alternative), every device the node sees with the first rule that excluded it, in the
allocator's own order (`Rule`), how many candidates are left, and how many devices the node is
short of.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from services.allocator.allocator import Attempt, Cluster
from services.allocator.device import device_id
from services.allocator.errors import SelectorError, UnsatisfiableError
from services.allocator.exclusion import Exclusion, Rule
from services.allocator.request import Alternative, ClaimSpec
from services.allocator.result import AllocationResult

__all__ = ["AlternativeReport", "DeviceVerdict", "NodeReport", "explain_node"]


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
