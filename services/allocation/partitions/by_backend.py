"""The partition manager the agent uses: one per backend, picked by the node's own backend.

`build()` makes the composite of the sim, MIG (nvml) and vNPU (ascend) managers. Partitions are
made by the manager that `supports()` the agent's `--backend`, the one the preparer checked
against; removal and listing go to every manager, each of which knows only
the partitions its own state file records. The hardware managers load NVML or run npu-smi at
their first partition, so an agent that never makes one never touches either.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import structlog

from services.allocation.config import AllocationConfig
from services.allocation.partitions import Partition, PartitionManager
from services.allocation.partitions.mig import MigPartitionManager
from services.allocation.partitions.nvidia_caps import CapsNodes
from services.allocation.partitions.sim import SimPartitionManager
from services.allocation.partitions.vnpu import VnpuPartitionManager
from shared.errors import ClaimError
from shared.pb.drasuite.v1 import inventory_pb2

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
    """The agent's partition manager: sim, MIG and vNPU, over the plugin data dir; partitions
    are made by the manager of the node's own backend (`--backend`)."""
    timeout_s = config.partition_timeout_s
    return CompositePartitionManager(
        [
            SimPartitionManager(config.partition_state_path),
            MigPartitionManager(
                config.mig_partition_state_path, caps_nodes=CapsNodes(), timeout_s=timeout_s
            ),
            VnpuPartitionManager(
                config.vnpu_partition_state_path, npu_smi=config.npu_smi_path, timeout_s=timeout_s
            ),
        ],
        backend=lambda: config.backend,
    )
