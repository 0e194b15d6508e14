"""Who a reviewed ServiceAccount token belongs to: a node agent, an operator, or nobody.

Pure: a TokenReview status in, an `Identity` or a `Refusal` out. A node agent is one of the
three agent ServiceAccounts of the agent namespace with a node binding (the token was bound to
a pod on that node, so `authentication.kubernetes.io/node-name` is in `extra`); an operator is
a listed user or a member of a listed group. Names that end up in subjects are checked to be
DNS names, so no wildcard or extra token can come in through them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["AGENT_ROLES", "Identity", "Policy", "Refusal", "identify"]

AGENT_ROLES = {"dra-discovery": "discovery", "dra-allocation": "allocation", "dra-health": "health"}
_SA_PREFIX = "system:serviceaccount:"
_NODE_NAME = "authentication.kubernetes.io/node-name"
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


@dataclass(frozen=True, slots=True)
class Identity:
    role: str
    """discovery, allocation, health or operator."""
    node: str = ""
    """The node a node agent acts for; empty for an operator."""
    username: str = ""


@dataclass(frozen=True, slots=True)
class Refusal:
    reason: str
    """A low-cardinality label for metrics (`token_invalid`, `unknown_identity`, ...)."""
    detail: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Policy:
    agent_namespace: str
    operator_users: frozenset[str]
    operator_groups: frozenset[str]


def _extra(user: Mapping[str, Any], key: str) -> str:
    values = (user.get("extra") or {}).get(key) or []
    return str(values[0]) if isinstance(values, Sequence) and len(values) == 1 else ""


def identify(status: Mapping[str, Any], policy: Policy) -> Identity | Refusal:
    """Map a TokenReview `status` to an identity under `policy`."""
    if status.get("authenticated") is not True:
        return Refusal("token_invalid", str(status.get("error") or "token not authenticated"))
    user = status.get("user") or {}
    username = str(user.get("username") or "")
    groups = {str(group) for group in user.get("groups") or ()}
    if username in policy.operator_users or groups & policy.operator_groups:
        return Identity(role="operator", username=username)
    namespace, _, account = username.removeprefix(_SA_PREFIX).partition(":")
    if not username.startswith(_SA_PREFIX) or namespace != policy.agent_namespace:
        return Refusal("unknown_identity", f"{username!r} is no dra-suite agent or operator")
    role = AGENT_ROLES.get(account)
    if role is None:
        return Refusal("unknown_identity", f"service account {account!r} is no dra-suite agent")
    node = _extra(user, _NODE_NAME)
    if not node:
        return Refusal("no_node_binding", f"{username!r}: the token is not bound to a node")
    if len(node) > 253 or not _DNS_SUBDOMAIN.match(node):
        return Refusal("bad_node_name", f"{username!r}: node name {node!r} is not a DNS name")
    return Identity(role=role, node=node, username=username)
