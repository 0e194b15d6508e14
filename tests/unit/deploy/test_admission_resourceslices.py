"""The ResourceSlice admission policy (deploy/kustomize/admission/resourceslices.yaml), its CEL
evaluated with celpy on sample admission requests: the discovery agent writes only the slices
of the node its service-account token is bound to."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.deploy.manifests import (
    DISCOVERY_USER,
    KUSTOMIZE,
    NODE_KEY,
    SIM,
    _docs,
    admission_policy,
    admission_request,
    evaluate_policy,
)

# --- ResourceSlices: only the agent's own node --------------------------------------------


def _slice(node: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"driver": SIM, "pool": {"name": node or "shared"}}
    spec.update({"nodeName": node} if node else {"allNodes": True})
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "spec": spec}


ON_A = {NODE_KEY: ["node-a"], "authentication.kubernetes.io/pod-name": ["dra-discovery-x"]}
SLICE_CASES: list[
    tuple[Any, ...]
] = [  # (operation, object, oldObject, user, extra, matched, denial or None)
    ("CREATE", _slice("node-a"), None, DISCOVERY_USER, ON_A, True, None),
    ("UPDATE", _slice("node-a"), _slice("node-a"), DISCOVERY_USER, ON_A, True, None),
    ("DELETE", None, _slice("node-a"), DISCOVERY_USER, ON_A, True, None),
    (
        "CREATE",
        _slice("node-b"),
        None,
        DISCOVERY_USER,
        ON_A,
        True,
        "the discovery agent on node node-a may not write ResourceSlices of node node-b",
    ),
    (
        "UPDATE",
        _slice("node-b"),
        _slice("node-b"),
        DISCOVERY_USER,
        ON_A,
        True,
        "the discovery agent on node node-a may not write ResourceSlices of node node-b",
    ),
    (
        "DELETE",
        None,
        _slice("node-b"),
        DISCOVERY_USER,
        ON_A,
        True,
        "the discovery agent on node node-a may not write ResourceSlices of node node-b",
    ),
    (
        "CREATE",
        _slice(None),
        None,
        DISCOVERY_USER,
        ON_A,
        True,
        "the discovery agent on node node-a may not write ResourceSlices without spec.nodeName",
    ),
    (
        "CREATE",
        _slice("node-a"),
        None,
        DISCOVERY_USER,
        None,
        True,
        "the discovery agent's request carries no node name",
    ),
    (
        "CREATE",
        _slice("node-a"),
        None,
        DISCOVERY_USER,
        {NODE_KEY: []},
        True,
        "the discovery agent's request carries no node name",
    ),
    ("CREATE", _slice("node-b"), None, "system:serviceaccount:other:driver", ON_A, False, None),
    ("DELETE", None, _slice("node-b"), "system:node:node-a", None, False, None),
]
SLICE_IDS = [
    "the agent creates a slice of its own node",
    "the agent updates a slice of its own node",
    "the agent deletes a slice of its own node",
    "the agent may not create a slice of another node",
    "the agent may not update a slice of another node",
    "the agent may not delete a slice of another node",
    "the agent may not create a slice for all nodes",
    "a token without a bound node is refused",
    "an empty node-name extra is refused",
    "another driver's account is not matched",
    "the kubelet is not matched",
]


@pytest.mark.parametrize(
    ("operation", "obj", "old", "user", "extra", "matched", "denial"), SLICE_CASES, ids=SLICE_IDS
)
def test_slice_policy_lets_the_discovery_agent_write_only_its_nodes_slices(
    operation, obj, old, user, extra, matched, denial
):
    policy = admission_policy("resourceslices.yaml", "dra-suite-resourceslices-own-node")
    request = admission_request(
        resource="resourceslices", operation=operation, obj=obj, old=old, user=user, extra=extra
    )
    verdict = evaluate_policy(policy, request)
    assert verdict.matched == matched
    if denial is None:
        assert verdict.allowed, verdict.denials
    else:
        assert any(d.startswith(denial) for d in verdict.denials), verdict.denials


def test_slice_policy_names_the_discovery_agents_account_and_the_tokens_node_claim():
    policy = admission_policy("resourceslices.yaml", "dra-suite-resourceslices-own-node")
    account = next(
        d
        for d in _docs(KUSTOMIZE / "base" / "rbac-discovery.yaml")
        if d["kind"] == "ServiceAccount"
    )
    meta = account["metadata"]
    assert f"system:serviceaccount:{meta['namespace']}:{meta['name']}" == DISCOVERY_USER
    assert DISCOVERY_USER in policy["spec"]["matchConditions"][0]["expression"]
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert set(rule["operations"]) == {"CREATE", "UPDATE", "DELETE"}
    assert rule["resources"] == ["resourceslices"]
