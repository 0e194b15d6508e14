"""Nodes without a kubelet: registered as objects with the status a kubelet would post, so
that kube-scheduler places pods on them (it needs allocatable `pods`, CPU and memory)."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Mapping
from typing import Any

from shared.errors import KubeNotFoundError
from shared.kube.client import KubeClient
from shared.kube.resources import NODES, ResourceType

__all__ = ["register_node", "wait_for_service_account"]

_SERVICE_ACCOUNTS = ResourceType("", "v1", "serviceaccounts", "ServiceAccount", namespaced=True)


async def register_node(
    client: KubeClient,
    name: str,
    *,
    labels: Mapping[str, str] | None = None,
    cpu: str = "16",
    memory: str = "64Gi",
    pods: int = 110,
) -> dict[str, Any]:
    """Create the Node and post a Ready status with capacity; returns the stored Node."""
    node = await client.create(
        NODES,
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {"kubernetes.io/hostname": name, **(labels or {})},
            },
        },
    )
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    resources = {"cpu": cpu, "memory": memory, "pods": str(pods)}
    ready = {
        "type": "Ready",
        "status": "True",
        "reason": "KubeletReady",
        "message": "registered by the dra-suite control-plane harness (no kubelet)",
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }
    status = {"status": {"capacity": resources, "allocatable": resources, "conditions": [ready]}}
    await client.patch(NODES, name, status, subresource="status", patch_type="merge")
    # The TaintNodesByCondition admission plugin taints every new Node not-ready; the node
    # lifecycle controller (off here) lifts it once the kubelet reports Ready.
    node = await client.patch(NODES, name, {"spec": {"taints": None}}, patch_type="merge")
    node["status"] = status["status"]
    return node


async def wait_for_service_account(
    client: KubeClient, namespace: str, name: str = "default", *, timeout_s: float = 30.0
) -> None:
    """Until the serviceaccount controller made `name` (pods cannot be created before)."""
    async with asyncio.timeout(timeout_s):
        while True:
            try:
                await client.get(_SERVICE_ACCOUNTS, name, namespace=namespace)
                return
            except KubeNotFoundError:
                await asyncio.sleep(0.1)
