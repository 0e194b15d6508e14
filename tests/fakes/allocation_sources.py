"""What the allocation agent's preparer reads, held still by a test: the node's inventory and a
single ResourceClaim."""

from __future__ import annotations

from typing import Any

from shared.kube.resources import ResourceType
from shared.pb.drasuite.v1 import inventory_pb2

__all__ = ["FakeInventory", "OneClaimReader"]


class FakeInventory:
    """An InventorySource whose inventory the test sets (None: not known yet)."""

    def __init__(self, current: inventory_pb2.Inventory | None) -> None:
        self.current = current


class OneClaimReader:
    """A KubeReader that answers every get with the one claim it holds."""

    def __init__(self, claim: dict[str, Any]) -> None:
        self.claim = claim

    async def get(
        self, rt: ResourceType, name: str, *, namespace: str | None = None
    ) -> dict[str, Any]:
        return self.claim
