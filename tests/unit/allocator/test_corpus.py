"""Every scenario of the corpus (tests/unit/allocator/corpus/*.yaml), written from the upstream
allocator's documented semantics, gets the verdict and the reason it expects from `explain`."""

from __future__ import annotations

from typing import Any

import pytest

from services.allocator.allocator import Cluster
from services.allocator.errors import ClaimError
from services.allocator.explanation import explain
from services.allocator.node_report import NodeReport
from services.allocator.request import read_claim
from tests.unit.allocator.corpus import Scenario, load

SCENARIOS = load()


def test_the_corpus_holds_at_least_a_hundred_scenarios():
    assert len(SCENARIOS) >= 100
    assert len({s.name for s in SCENARIOS}) == len(SCENARIOS)


def _run(scenario: Scenario) -> tuple[NodeReport | None, str, str]:
    cluster = Cluster.build(
        slices=scenario.slices(),
        classes=scenario.classes(),
        claims=scenario.other_claims(),
        taint_rules=scenario.taint_rules(),
    )
    try:
        spec = read_claim(scenario.claim(), cluster.classes)
    except ClaimError as exc:
        return None, str(exc), ""
    explanation = explain(cluster, spec, nodes=[scenario.node])
    return explanation.nodes[0], "", explanation.change


def _allocation(report: NodeReport) -> list[str]:
    return [f"{r.request}={r.device}" for r in report.allocation]


def _verdicts(report: NodeReport, request: str) -> dict[str, Any]:
    for alternative in report.requests:
        if alternative.name == request:
            return {v.device.rsplit("/", 1)[1]: v.exclusion for v in alternative.devices}
    raise AssertionError(f"no report for request {request}: {[a.name for a in report.requests]}")


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_scenario(scenario: Scenario):
    expect = scenario.expect
    report, claim_error, change = _run(scenario)
    if "claimError" in expect:
        assert expect["claimError"] in claim_error
        return
    assert not claim_error, claim_error
    assert report is not None
    if "error" in expect:
        assert expect["error"] in report.error
        assert not report.fits
        return
    assert not report.error, report.error
    assert report.fits is expect["fits"], report
    if "allocation" in expect:
        assert _allocation(report) == expect["allocation"]
    for device, consumed in (expect.get("consumed") or {}).items():
        shares = [r for r in report.allocation if r.device == device]
        assert shares
        assert all(r.share_id for r in shares)
        assert dict(shares[0].consumed_capacity or {}) == consumed
    for reason in [expect["reason"]] if "reason" in expect else expect.get("reasons", []):
        exclusion = _verdicts(report, reason["request"])[reason["device"]]
        assert exclusion.rule == reason["rule"], exclusion
        assert reason.get("message", "") in exclusion.message
    for request, count in (expect.get("candidates") or {}).items():
        assert [a.candidates for a in report.requests if a.name == request] == [count]
    if "skipped" in expect:
        assert [a.name for a in report.requests if a.skipped] == expect["skipped"]
    if "change" in expect:
        assert expect["change"] in change
