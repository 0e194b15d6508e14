"""The claim status admission policy (deploy/kustomize/admission/resourceclaims.yaml), its CEL
evaluated with celpy on sample admission requests: the allocation agent writes only its own
driver's `status.devices` entries, only of claims allocated to the node its token is bound to,
and nothing else of the status."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.unit.deploy.manifests import (
    KUSTOMIZE,
    NODE_KEY,
    SIM,
    _docs,
    admission_policy,
    admission_request,
    evaluate_policy,
    policy_with_driver,
)

AGENT = "system:serviceaccount:dra-suite:dra-allocation"
ON_A = {NODE_KEY: ["node-a"]}
NIC = {"driver": "nic.example.com", "pool": "node-a", "device": "eth1", "conditions": []}


def _claim(node: str | None = "node-a", devices: list[dict[str, Any]] | None = None) -> Any:
    allocation: dict[str, Any] = {
        "devices": {"results": [{"request": "gpu", "driver": SIM, "pool": "p", "device": "gpu-0"}]}
    }
    if node is not None:
        term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
        allocation["nodeSelector"] = {"nodeSelectorTerms": [term]}
    status: dict[str, Any] = {"allocation": allocation, "reservedFor": [
        {"resource": "pods", "name": "trainer", "uid": "u1"}]}  # fmt: skip
    if devices is not None:
        status["devices"] = devices
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "status": status}


def _ours(status: str = "True") -> dict[str, Any]:
    condition = {"type": "Ready", "status": status, "reason": "Prepared", "message": "",
                 "lastTransitionTime": "2026-01-01T00:00:00Z"}  # fmt: skip
    return {"driver": SIM, "pool": "node-a", "device": "gpu-0", "conditions": [condition]}


def _with(claim: Any, **status: Any) -> Any:
    changed = copy.deepcopy(claim)
    changed["status"].update(status)
    return changed


CASES: list[tuple[Any, ...]] = [  # (new, old, user, extra, matched, denial or None)
    (_claim(devices=[NIC, _ours()]), _claim(devices=[NIC]), AGENT, ON_A, True, None),
    (_claim(devices=[_ours("False")]), _claim(devices=[_ours()]), AGENT, ON_A, True, None),
    (_claim(devices=[NIC]), _claim(devices=[NIC, _ours()]), AGENT, ON_A, True, None),
    (_claim("node-b", [_ours()]), _claim("node-b", []), AGENT, ON_A, True,
     "the allocation agent on node node-a may only write the status of claims allocated to "
     "that node (this claim is allocated to node-b)"),
    (_claim(None, [_ours()]), _claim(None, []), AGENT, ON_A, True,
     "the allocation agent on node node-a may only write the status of claims allocated to "
     "that node (this claim is allocated to no single node)"),
    (_claim(devices=[_ours()]), _claim(devices=[NIC]), AGENT, ON_A, True,
     "the allocation agent may only change the status.devices entries of driver " + SIM),
    (_with(_claim(devices=[_ours()]), reservedFor=[]), _claim(devices=[]), AGENT, ON_A, True,
     "the allocation agent may not change status.allocation or status.reservedFor"),
    (_claim(devices=[_ours()]), _claim(devices=[]), AGENT, None, True,
     "the allocation agent's request carries no node name"),
    (_claim("node-b", [_ours()]), _claim("node-b", []), "system:serviceaccount:x:y", ON_A,
     False, None),
]  # fmt: skip
IDS = [
    "the agent adds its entries beside another driver's",
    "the agent updates its own entry",
    "the agent removes its own entry",
    "not a claim of another node",
    "not a claim allocated to no single node",
    "not another driver's entry",
    "not the scheduler's fields",
    "a token without a bound node is refused",
    "other users are not matched",
]


@pytest.mark.parametrize(("new", "old", "user", "extra", "matched", "denial"), CASES, ids=IDS)
def test_the_agent_writes_only_its_drivers_entries_of_its_nodes_claims(
    new, old, user, extra, matched, denial
):
    policy = admission_policy("resourceclaims.yaml", "dra-suite-resourceclaim-status-own-node")
    request = admission_request(
        resource="resourceclaims", operation="UPDATE", obj=new, old=old, user=user, extra=extra
    )
    verdict = evaluate_policy(policy, request)
    assert verdict.matched == matched
    if denial is None:
        assert verdict.allowed, verdict.denials
    else:
        assert any(d.startswith(denial) for d in verdict.denials), verdict.denials


def test_an_overlays_driver_is_the_one_whose_entries_may_change():
    policy = policy_with_driver(
        admission_policy("resourceclaims.yaml", "dra-suite-resourceclaim-status-own-node"),
        "gpu.dra-suite.io",
    )
    request = admission_request(
        resource="resourceclaims",
        operation="UPDATE",
        obj=_claim(devices=[_ours()]),
        old=_claim(devices=[]),
        user=AGENT,
        extra=ON_A,
    )
    assert not evaluate_policy(policy, request).allowed


def test_the_policy_names_the_allocation_agents_account_and_only_the_status_subresource():
    policy = admission_policy("resourceclaims.yaml", "dra-suite-resourceclaim-status-own-node")
    account = next(
        d
        for d in _docs(KUSTOMIZE / "base" / "rbac-allocation.yaml")
        if d["kind"] == "ServiceAccount"
    )
    meta = account["metadata"]
    assert f"system:serviceaccount:{meta['namespace']}:{meta['name']}" == AGENT
    assert AGENT in policy["spec"]["matchConditions"][0]["expression"]
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["operations"] == ["UPDATE"]
    assert rule["resources"] == ["resourceclaims/status"]
