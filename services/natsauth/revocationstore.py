"""The revocation list's home: a ConfigMap, read by every auth replica, written by operators.

Kubernetes keeps it (it survives restarts of the service, both replicas read the same one) and
Kubernetes RBAC decides who may change it (the operator group, `rbac-operator.yaml`); the API
server's audit log records who did. Writes are merge patches of one data key, so two operators
revoking two nodes at once do not overwrite each other. The quota auditor's writes
(`revoke_once`) are conditional on the resourceVersion read, so of two replicas that find the
same node over its quota exactly one writes it.
"""

from __future__ import annotations

from services.natsauth import revocations
from services.natsauth.revocations import Revocation
from shared.errors import KubeAlreadyExistsError, KubeConflictError, KubeNotFoundError
from shared.kube.client import KubeClient
from shared.kube.resources import ResourceType

__all__ = ["CONFIGMAPS", "RevocationStore"]

CONFIGMAPS = ResourceType("", "v1", "configmaps", "ConfigMap", namespaced=True)


class RevocationStore:
    def __init__(
        self, kube: KubeClient, *, namespace: str, name: str = revocations.CONFIGMAP
    ) -> None:
        self._kube = kube
        self._namespace = namespace
        self._name = name

    async def read(self) -> dict[str, Revocation]:
        """Every entry; none when the ConfigMap does not exist (nobody was ever revoked)."""
        try:
            found = await self._kube.get(CONFIGMAPS, self._name, namespace=self._namespace)
        except KubeNotFoundError:
            return {}
        return revocations.parse(found.get("data"))

    async def revoke(self, revocation: Revocation) -> None:
        patch = {"data": {revocation.node: revocations.encode(revocation)}}
        try:
            await self._kube.patch(CONFIGMAPS, self._name, patch, namespace=self._namespace)
            return
        except KubeNotFoundError:
            pass
        body = {
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": self._name, "namespace": self._namespace,
                         "labels": {"app.kubernetes.io/component": "nats-auth"}},
            **patch,
        }  # fmt: skip
        try:
            await self._kube.create(CONFIGMAPS, body, namespace=self._namespace)
        except KubeAlreadyExistsError:  # made meanwhile by another operator
            await self._kube.patch(CONFIGMAPS, self._name, patch, namespace=self._namespace)

    async def revoke_once(self, revocation: Revocation, *, now: float) -> bool:
        """Add `revocation` unless its node is revoked already: True when this call wrote it,
        False when the list had the node in force (another replica, an operator)."""
        while True:
            try:
                found = await self._kube.get(CONFIGMAPS, self._name, namespace=self._namespace)
            except KubeNotFoundError:
                try:
                    await self._kube.create(CONFIGMAPS, self._body(revocation),
                                            namespace=self._namespace)  # fmt: skip
                except KubeAlreadyExistsError:
                    continue  # made meanwhile: read it
                return True
            entry = revocations.parse(found.get("data")).get(revocation.node)
            if entry is not None and entry.active(now):
                return False
            patch = {
                "metadata": {"resourceVersion": found["metadata"]["resourceVersion"]},
                "data": {revocation.node: revocations.encode(revocation)},
            }
            try:
                await self._kube.patch(CONFIGMAPS, self._name, patch, namespace=self._namespace)
            except KubeConflictError:
                continue  # changed since read: read it again
            return True

    def _body(self, revocation: Revocation) -> dict[str, object]:
        return {
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": self._name, "namespace": self._namespace,
                         "labels": {"app.kubernetes.io/component": "nats-auth"}},
            "data": {revocation.node: revocations.encode(revocation)},
        }  # fmt: skip

    async def unrevoke(self, node: str) -> bool:
        """False when the node was not revoked."""
        if node not in await self.read():
            return False
        patch = {"data": {node: None}}
        await self._kube.patch(CONFIGMAPS, self._name, patch, namespace=self._namespace)
        return True
