"""The partition manager the agent uses: one per backend, picked by the node's own backend.

`build()` makes the composite of every registered vendor's manager (`Vendor.partitions`).
Partitions are made by the manager that `supports()` the agent's `--backend`, the one the
preparer checked against; removal and listing go to every manager, each of which knows only
the partitions its own state file records. The hardware managers load NVML or run npu-smi at
their first partition, so an agent that never makes one never touches either.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import structlog

from services.allocation.config import AllocationConfig
from shared.errors import ClaimError
from shared.pb.drasuite.v1 import inventory_pb2
from shared.vendors import registry
from shared.vendors.parts.partitions import Partition, PartitionManager

__all__ = ["CompositePartitionManager", "build"]

log = structlog.get_logger(__name__)


class CompositePartitionManager:
    """A `PartitionManager` that hands each call to the managers it concerns."""

    def __init__(self, managers: Sequence[PartitionManager], *, backend: Callable[[], str]) -> None:
        self.managers = tuple(managers)
        self._backend = backend

    def supports(self, backend: str) -> bool:
        return any(m.supports(backend) for m in self.managers)

    def _current(self, claim_uid: str) -> PartitionManager:
        backend = self._backend()
        for manager in self.managers:
            if manager.supports(backend):
                return manager
        raise ClaimError(
            f"claim {claim_uid}: the {backend or 'unknown'} backend cannot make partitions",
            claim_uid=claim_uid,
        )

    def check(
        self,
        *,
        claim_uid: str,
        device: inventory_pb2.Device,
        profile: str,
        placement: int | None = None,
    ) -> None:
        self._current(claim_uid).check(
            claim_uid=claim_uid, device=device, profile=profile, placement=placement
        )

    async def create(
        self,
        *,
        claim_uid: str,
        device: inventory_pb2.Device,
        profile: str,
        placement: int | None = None,
    ) -> Partition:
        manager = self._current(claim_uid)
        return await manager.create(
            claim_uid=claim_uid, device=device, profile=profile, placement=placement
        )

    async def delete_claim(self, claim_uid: str) -> list[Partition]:
        """Every manager removes the claim's partitions; the first failure is raised after all
        of them tried, so one backend's trouble never keeps another's partitions."""
        removed: list[Partition] = []
        errors: list[ClaimError] = []
        for manager in self.managers:
            try:
                removed += await manager.delete_claim(claim_uid)
            except ClaimError as exc:
                errors.append(exc)
        if errors:
            raise errors[0]
        return removed

    async def partitions(self) -> list[Partition]:
        """Every manager's partitions; one whose state is unreadable is left out (logged)."""
        found: list[Partition] = []
        for manager in self.managers:
            try:
                found += await manager.partitions()
            except ClaimError as exc:
                log.error("partitions_unreadable", manager=type(manager).__name__, error=str(exc))
        return found


def build(config: AllocationConfig) -> CompositePartitionManager:
    """The agent's partition manager: every vendor's, over the plugin data dir; partitions
    are made by the manager of the node's own backend (`--backend`)."""
    return CompositePartitionManager(
        [vendor.partitions(config) for vendor in registry.BACKENDS.values()],
        backend=lambda: config.backend,
    )
