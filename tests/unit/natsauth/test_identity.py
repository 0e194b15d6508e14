"""TokenReview answers to bus identities: agents bound to a node, operators, and refusals."""

from __future__ import annotations

from typing import Any

import pytest

from services.natsauth.identity import Identity, Policy, Refusal, identify

POLICY = Policy(
    agent_namespace="dra-suite",
    operator_users=frozenset({"alice"}),
    operator_groups=frozenset({"dra-suite:operators"}),
)
NODE_KEY = "authentication.kubernetes.io/node-name"


def review(username: str, *, node: str | None = None, groups: tuple[str, ...] = ()) -> Any:
    extra = {NODE_KEY: [node]} if node is not None else {}
    return {
        "authenticated": True,
        "user": {"username": username, "groups": list(groups), "extra": extra},
    }


AGENT = "system:serviceaccount:dra-suite:dra-health"
CASES = {
    "health agent on its node": (review(AGENT, node="node-a"), Identity("health", "node-a", AGENT)),
    "operator by name": (review("alice"), Identity("operator", "", "alice")),
    "operator by group": (
        review("bob", groups=("dra-suite:operators",)),
        Identity("operator", "", "bob"),
    ),
    "not authenticated": ({"authenticated": False, "error": "expired"}, "token_invalid"),
    "agent without a node binding": (review(AGENT), "no_node_binding"),
    "agent of another namespace": (
        review("system:serviceaccount:other:dra-health", node="n"),
        "unknown_identity",
    ),
    "another service account": (
        review("system:serviceaccount:dra-suite:default", node="n"),
        "unknown_identity",
    ),
    "a plain user": (review("mallory"), "unknown_identity"),
    "a node name with a wildcard": (review(AGENT, node="node-*"), "bad_node_name"),
    "a node name with a subject separator": (review(AGENT, node="a >"), "bad_node_name"),
}


@pytest.mark.parametrize(("status", "expected"), CASES.values(), ids=CASES)
def test_identify(status: Any, expected: Identity | str):
    found = identify(status, POLICY)
    if isinstance(expected, str):
        assert isinstance(found, Refusal)
        assert found.reason == expected
    else:
        assert found == expected


def test_two_node_names_are_no_node_binding():
    status = review(AGENT)
    status["user"]["extra"][NODE_KEY] = ["node-a", "node-b"]
    assert identify(status, POLICY) == Refusal(
        "no_node_binding", f"{AGENT!r}: the token is not bound to a node"
    )
