"""Least privilege against the real authorizer: with the sim overlay's RBAC applied, a
SubjectAccessReview for each agent's ServiceAccount allows exactly the calls its rendered
ClusterRole lists (the calls `tests/unit/deploy/test_rbac_least_privilege.py` measures the
agents making) and nothing else on the resources any agent touches, nor on a few sensitive
ones: the defaults kube-apiserver binds to every ServiceAccount add no such grant."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from shared.kube.client import KubeClient
from shared.kube.resources import ResourceType
from tests.k8s.apply import Applier
from tests.unit.deploy.manifests import KUBECTL, render

pytestmark = [
    pytest.mark.k8s,
    pytest.mark.skipif(KUBECTL is None, reason="kubectl renders the overlays"),
]

NAMESPACE = "dra-suite"
DRIVER = "sim.dra-suite.io"
AGENTS = {"discovery": "dra-discovery", "allocation": "dra-allocation", "health": "dra-health"}
RBAC_KINDS = {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding"}
VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")
SENSITIVE = {("", "secrets"), ("", "pods"), ("", "nodes/status"), ("", "serviceaccounts/token")}
SUBJECT_ACCESS_REVIEWS = ResourceType(
    "authorization.k8s.io", "v1", "subjectaccessreviews", "SubjectAccessReview", False
)
Call = tuple[str, str, str, str]  # (API group, resource[/subresource], verb, resource name)


@pytest.fixture
async def roles(admin: KubeClient) -> AsyncIterator[dict[str, dict[str, Any]]]:
    """The overlay's ServiceAccounts, ClusterRoles and their bindings, removed afterwards."""
    docs = [d for d in render("overlays/sim") if d["kind"] in RBAC_KINDS]
    applier = Applier(admin)
    try:
        for doc in sorted(docs, key=lambda d: d["kind"] != "Namespace"):
            await applier.create(doc)
        yield {d["metadata"]["name"]: d for d in docs if d["kind"] == "ClusterRole"}
    finally:
        await applier.delete_all()


def _granted(role: dict[str, Any]) -> set[Call]:
    return {
        (group, resource, verb, name)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
        for name in rule.get("resourceNames") or [""]
    }


async def test_each_agent_is_allowed_exactly_its_roles_calls(
    admin: KubeClient, roles: dict[str, dict[str, Any]]
):
    granted = {agent: _granted(roles[f"dra-suite-{agent}"]) for agent in AGENTS}
    touched = {(g, r) for calls in granted.values() for g, r, _, _ in calls} | SENSITIVE
    asked = {(g, r, v, "") for g, r in touched for v in VERBS}
    named = {c for calls in granted.values() for c in calls if c[3]}
    # A grant for one resource name only: another name, and no name, are refused.
    asked |= named | {(g, r, v, "another.example.com") for g, r, v, _ in named}
    asked |= {(g, r, v, "") for g, r, v, _ in named}
    problems = []
    for agent, account in AGENTS.items():
        calls = sorted(asked | granted[agent])
        # The roles were just bound: RBAC's informer may lag them by a moment.
        for _ in range(50):
            answers = await asyncio.gather(*(_allowed(admin, account, c) for c in calls))
            allowed = {c for c, ok in zip(calls, answers, strict=True) if ok}
            if granted[agent] <= allowed:
                break
            await asyncio.sleep(0.1)
        problems += [f"{agent} is not allowed {c}" for c in sorted(granted[agent] - allowed)]
        problems += [
            f"{agent} is allowed {c} beyond its role" for c in sorted(allowed - granted[agent])
        ]
    assert problems == [], "\n".join(problems)
    assert sum(map(len, granted.values())) >= 15


async def _allowed(admin: KubeClient, account: str, call: Call) -> bool:
    group, resource, verb, name = call
    resource, _, subresource = resource.partition("/")
    attributes = {"group": group, "resource": resource, "verb": verb}
    if subresource:
        attributes["subresource"] = subresource
    if name:
        attributes["name"] = name
    review = await admin.create(SUBJECT_ACCESS_REVIEWS, {
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {
            "user": f"system:serviceaccount:{NAMESPACE}:{account}",
            "groups": ["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}",
                       "system:authenticated"],
            "resourceAttributes": attributes,
        },
    })  # fmt: skip
    return bool(review["status"].get("allowed"))
