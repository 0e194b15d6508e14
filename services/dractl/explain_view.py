"""`dractl explain` output: an Explanation as JSON/YAML data, or as a table for people."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from services.allocator.exclusion import Rule
from services.allocator.explanation import Explanation, PodExplanation
from services.allocator.node_report import AlternativeReport, NodeReport

__all__ = ["as_data", "table"]


def as_data(
    explanation: Explanation | PodExplanation, *, status: Sequence[Mapping[str, Any]] = ()
) -> dict[str, Any]:
    """`status`: the claim's `status.devices` (KEP-4817), as the drivers wrote them."""
    if isinstance(explanation, PodExplanation):
        return _pod(explanation)
    data: dict[str, Any] = {
        "claim": explanation.claim,
        "fits": explanation.fits,
        "nodes": [_node(n) for n in explanation.nodes],
    }
    if explanation.closest:
        data["closest"] = {"node": explanation.closest, "change": explanation.change or None}
    if status:
        data["devices"] = [dict(device) for device in status]
    return data


def _pod(explanation: PodExplanation) -> dict[str, Any]:
    nodes = []
    for report in explanation.nodes:
        node: dict[str, Any] = {"node": report.node, "fits": report.fits}
        if report.allocation:
            node["allocation"] = {
                claim: [r.as_json() for r in results] for claim, results in report.allocation
            }
        if report.error:
            node["error"] = report.error
        if report.reason:
            node["reason"] = report.reason
        nodes.append(node)
    return {
        "pod": explanation.pod,
        "claims": list(explanation.claims),
        "fits": explanation.fits,
        "nodes": nodes,
    }


def _node(report: NodeReport) -> dict[str, Any]:
    data: dict[str, Any] = {"node": report.node, "fits": report.fits}
    if report.allocation:
        data["allocation"] = [r.as_json() for r in report.allocation]
    if report.error:
        data["error"] = report.error
    if report.requests:
        data["requests"] = [_alternative(a) for a in report.requests]
    return data


def _alternative(report: AlternativeReport) -> dict[str, Any]:
    data: dict[str, Any] = {
        "request": report.name,
        "needed": "All" if report.needed is None else report.needed,
        "candidates": report.candidates,
    }
    if report.skipped:
        data["skipped"] = report.skipped
    if report.devices:
        data["devices"] = [{"device": v.device, **v.exclusion.as_json()} for v in report.devices]
    return data


def table(
    explanations: Sequence[Explanation | PodExplanation],
    *,
    out: TextIO,
    statuses: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    wide: bool = False,
) -> None:
    """`wide` also lists, per request, the devices outside its DeviceClass (only counted
    otherwise: on a mixed node they would bury the devices the request could have had)."""
    for explanation in explanations:
        if isinstance(explanation, PodExplanation):
            _pod_lines(explanation, out=out)
            continue
        _status_lines((statuses or {}).get(explanation.claim, ()), out=out)
        fitting = [n.node for n in explanation.nodes if n.fits]
        out.write(
            f"CLAIM {explanation.claim}: fits on {len(fitting)} of {len(explanation.nodes)} "
            f"node{'s' if len(explanation.nodes) != 1 else ''}\n"
        )
        for report in explanation.nodes:
            _node_lines(report, out=out, wide=wide)
        if explanation.closest:
            change = explanation.change or "no single change makes it fit"
            out.write(f"closest node: {explanation.closest}; change: {change}\n")


def _pod_lines(explanation: PodExplanation, *, out: TextIO) -> None:
    fitting = [n for n in explanation.nodes if n.fits]
    out.write(
        f"POD {explanation.pod}: its {len(explanation.claims)} claims fit together on "
        f"{len(fitting)} of {len(explanation.nodes)} nodes\n"
    )
    for report in explanation.nodes:
        if report.fits:
            picks = "; ".join(
                f"{claim}: " + ", ".join(_pick(r.as_json()) for r in results)
                for claim, results in report.allocation
            )
            out.write(f"  {report.node}: fits: {picks}\n")
        else:
            why = report.error or report.reason
            out.write(f"  {report.node}: does not fit{': ' + why if why else ''}\n")


def _node_lines(report: NodeReport, *, out: TextIO, wide: bool) -> None:
    if report.fits:
        picks = ", ".join(_pick(r.as_json()) for r in report.allocation)
        out.write(f"  {report.node}: fits: {picks}\n")
        for alternative in report.requests:
            if alternative.skipped:
                out.write(f"    {alternative.name}: skipped, {alternative.skipped}\n")
        return
    if report.error:
        out.write(f"  {report.node}: does not fit: {report.error}\n")
        return
    out.write(f"  {report.node}: does not fit\n")
    for alternative in report.requests:
        needed = "all" if alternative.needed is None else str(alternative.needed)
        out.write(
            f"    request {alternative.name}: needs {needed}, "
            f"{alternative.candidates} candidate{'s' if alternative.candidates != 1 else ''}\n"
        )
        shown = [v for v in alternative.devices if wide or v.exclusion.rule != Rule.CLASS_SELECTOR]
        width = max((len(v.device) for v in shown), default=0)
        for verdict in shown:
            out.write(f"      {verdict.device:<{width}}  {verdict.exclusion.message}\n")
        if hidden := len(alternative.devices) - len(shown):
            plural = "s" if hidden != 1 else ""
            out.write(f"      (+{hidden} device{plural} outside the class; -o wide lists them)\n")


def _status_lines(devices: Sequence[Mapping[str, Any]], *, out: TextIO) -> None:
    """The allocated devices' conditions as their drivers report them on the claim."""
    for device in devices:
        name = f"{device.get('driver', '')}/{device.get('pool', '')}/{device.get('device', '')}"
        conditions = device.get("conditions") or []
        shown = ", ".join(
            f"{c.get('type')}={c.get('status')}"
            + (f" ({c['reason']}: {c.get('message', '')})" if c.get("status") != "True" else "")
            for c in conditions
            if isinstance(c, Mapping)
        )
        out.write(f"DEVICE {name}: {shown or 'no conditions reported'}\n")


def _pick(result: dict[str, Any]) -> str:
    text = f"{result['request']} -> {result['driver']}/{result['pool']}/{result['device']}"
    if "shareID" in result:
        consumed = ",".join(f"{k}={v}" for k, v in result.get("consumedCapacity", {}).items())
        text += f" (share {result['shareID'][:8]}, {consumed})"
    if result.get("adminAccess"):
        text += " (admin access)"
    return text
