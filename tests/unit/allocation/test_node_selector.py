"""An allocation's nodeSelector must select this node: the forms upstream's allocator writes,
and selectors made for another node (a claim allocated elsewhere, or forged)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from services.allocation.claim import claims, node_selector
from services.allocation.claim.claims import ClaimRef
from shared.errors import ClaimError

DRIVER = "sim.dra-suite.io"
NODE = "node-a"


def _fields(operator: str, *values: str) -> dict[str, Any]:
    return {"matchFields": [{"key": "metadata.name", "operator": operator, "values": [*values]}]}


def _label(key: str, operator: str, *values: str) -> dict[str, Any]:
    requirement: dict[str, Any] = {"key": key, "operator": operator}
    if values:
        requirement["values"] = [*values]
    return {"matchExpressions": [requirement]}


def _selector(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"nodeSelectorTerms": [*terms]}


@pytest.mark.parametrize(
    "selector",
    [
        None,
        _selector(_fields("In", NODE)),
        _selector(_fields("In", "node-b", NODE)),
        _selector(_fields("NotIn", "node-b")),
        _selector(_label("kubernetes.io/hostname", "In", NODE)),
        _selector(_label("kubernetes.io/hostname", "Exists")),
        _selector(_fields("In", "node-b"), _fields("In", NODE)),
        _selector({**_fields("In", NODE), **_label("kubernetes.io/hostname", "In", NODE)}),
    ],
    ids=[
        "none-available-everywhere",
        "upstream-node-local",
        "name-among-several",
        "not-in-other",
        "hostname-label",
        "hostname-exists",
        "second-term-matches",
        "field-and-label-in-one-term",
    ],
)
def test_selectors_that_select_this_node_pass(selector):
    assert node_selector.mismatch(selector, node=NODE) is None


@pytest.mark.parametrize(
    ("selector", "reason"),
    [
        (_selector(_fields("In", "node-b")), "metadata.name In ['node-b']"),
        (_selector(_fields("NotIn", NODE)), "metadata.name NotIn ['node-a']"),
        (_selector(_label("kubernetes.io/hostname", "In", "node-b")), "hostname In ['node-b']"),
        (_selector(_label("topology.kubernetes.io/zone", "In", "z1")), "not checkable"),
        (
            _selector({**_fields("In", NODE), **_label("kubernetes.io/hostname", "In", "node-b")}),
            "hostname In ['node-b']",
        ),
        (_selector(_fields("Gt", "1")), "operator 'Gt'"),
        (_selector({}), "empty term"),
        ({"nodeSelectorTerms": []}, "no terms"),
        ({}, "no terms"),
        ("node-a", "not an object"),
    ],
    ids=[
        "other-node",
        "not-in-this-node",
        "hostname-of-other-node",
        "unknown-label",
        "one-requirement-fails-the-term",
        "unknown-operator",
        "empty-term",
        "no-terms",
        "empty-selector",
        "not-an-object",
    ],
)
def test_selectors_that_do_not_select_this_node_say_why(selector, reason):
    why = node_selector.mismatch(selector, node=NODE)
    assert why is not None
    assert reason in why


def test_a_claim_allocated_for_another_node_fails_with_the_selector_in_its_error(make_claim):
    uid = str(uuid.uuid4())
    claim = make_claim(uid=uid, devices=["npu-0"])
    claim["status"]["allocation"]["nodeSelector"] = _selector(_fields("In", "node-b"))
    ref = ClaimRef(namespace="default", name="claim-a", uid=uid)
    with pytest.raises(ClaimError, match=r"nodeSelector does not select node node-a.*node-b"):
        claims.select(claim, ref=ref, driver=DRIVER, pool=NODE, node=NODE)


def test_a_claim_allocated_for_this_node_is_selected(make_claim):
    uid = str(uuid.uuid4())
    claim = make_claim(uid=uid, devices=["npu-0"])
    claim["status"]["allocation"]["nodeSelector"] = _selector(_fields("In", NODE))
    ref = ClaimRef(namespace="default", name="claim-a", uid=uid)
    selected = claims.select(claim, ref=ref, driver=DRIVER, pool=NODE, node=NODE)
    assert [r.device for r in selected.results] == ["npu-0"]
