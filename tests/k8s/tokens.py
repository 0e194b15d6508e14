"""A ServiceAccount token as the kubelet mounts it into an agent's pod: bound to a pod that runs
on a given node, so the API server's user info names that node."""

from __future__ import annotations

import asyncio

from shared.errors import KubeError
from shared.kube.client import KubeClient
from shared.kube.resources import PODS, ResourceType

__all__ = ["pod_bound_token"]

SERVICE_ACCOUNTS = ResourceType("", "v1", "serviceaccounts", "ServiceAccount", namespaced=True)


async def pod_bound_token(admin: KubeClient, *, namespace: str, account: str, node: str) -> str:
    """Create a pod of `account` on `node` and a one-hour token bound to it."""
    pod = await admin.create(PODS, {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"{account}-{node}", "namespace": namespace},
        "spec": {"nodeName": node, "serviceAccountName": account,
                 "containers": [{"name": "agent", "image": "registry.k8s.io/pause:3.10"}]},
    }, namespace=namespace)  # fmt: skip
    request = {
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"expirationSeconds": 3600, "boundObjectRef": {
            "kind": "Pod", "apiVersion": "v1", "name": pod["metadata"]["name"],
            "uid": pod["metadata"]["uid"]}},
    }  # fmt: skip
    path = SERVICE_ACCOUNTS.path(namespace=namespace, name=account, subresource="token")
    for _ in range(50):  # the ServiceAccount may have been created a moment ago
        try:
            issued = await admin._request("POST", path, what="token request", body=request)
            return str(issued["status"]["token"])
        except KubeError:
            await asyncio.sleep(0.1)
    raise AssertionError(f"no token for {namespace}/{account}")
