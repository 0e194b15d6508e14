"""kube-apiserver's audit log as the tests read it: one record per request of a workload's
ServiceAccount (`cluster.AUDIT_POLICY`), with the node its token is bound to, the verb and
resource, the authorizer's decision and the response code."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["NODE_NAME", "AuditedCall", "read"]

NODE_NAME = "authentication.kubernetes.io/node-name"
"""The user-info extra that names the node a pod-bound token's pod runs on."""


@dataclass(frozen=True, slots=True)
class AuditedCall:
    audit_id: str
    user: str
    node: str
    """The node the token is bound to; empty for a token bound to no pod."""
    verb: str
    group: str
    resource: str
    """`resource[/subresource]`; empty for a non-resource URL (then `uri` says which)."""
    namespace: str
    name: str
    uri: str
    code: int
    decision: str
    """The authorizer's: `allow` or `forbid` (a refusal by admission comes after `allow`)."""
    message: str

    @property
    def call(self) -> tuple[str, str, str]:
        """(API group, resource[/subresource], verb), as an RBAC rule names it."""
        return (self.group, self.resource, self.verb)

    @property
    def dry_run(self) -> bool:
        return "dryRun=" in self.uri


def read(path: Path) -> list[AuditedCall]:
    """Every request logged so far, once (the last stage logged of each: a watch still open
    has only `ResponseStarted`)."""
    calls: dict[str, AuditedCall] = {}
    if not path.exists():
        return []
    for line in path.read_text().splitlines():
        if line.strip():
            call = _call(json.loads(line))
            calls[call.audit_id] = call
    return list(calls.values())


def _call(event: dict[str, Any]) -> AuditedCall:
    user = event.get("user") or {}
    ref = event.get("objectRef") or {}
    status = event.get("responseStatus") or {}
    resource = str(ref.get("resource", ""))
    if ref.get("subresource"):
        resource += f"/{ref['subresource']}"
    nodes = (user.get("extra") or {}).get(NODE_NAME) or [""]
    return AuditedCall(
        audit_id=str(event["auditID"]),
        user=str(user.get("username", "")),
        node=str(nodes[0]),
        verb=str(event.get("verb", "")),
        group=str(ref.get("apiGroup", "")),
        resource=resource,
        namespace=str(ref.get("namespace", "")),
        name=str(ref.get("name", "")),
        uri=str(event.get("requestURI", "")),
        code=int(status.get("code", 0)),
        decision=str((event.get("annotations") or {}).get("authorization.k8s.io/decision", "")),
        message=str(status.get("message", "")),
    )
