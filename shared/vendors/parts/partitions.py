"""Dynamic partitions made at prepare time: what a backend's partition manager offers (pure).

A claim whose opaque DeviceConfig names `partition: {profile: ...}` gets, for each of its
devices, one partition of that profile (a MIG device, a vNPU) made by the backend's
`PartitionManager` and removed at unprepare. Creation is idempotent by (claim UID, device): a
retry after a crash finds the partition made before it and never makes a second one. The
container gets the partition, not the whole device: its `Partition.device_nodes` replace the
device's own nodes in the CDI edits and its `env` overrides the device's.

Each vendor package makes its own manager (`Vendor.partitions`); the hardware managers record
what they made (`ledger`) before making it, and only ever remove what they recorded.

A device published as an option made on demand (a MIG slot or a vNPU template with
`createdOnDemand: true`, see `ON_DEMAND`) is not a device yet: preparing a claim that got one
makes a partition of its `parent` of the option's `profile`, for a MIG slot at its
`placementStart` (`OnDemandOption`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from shared.errors import ClaimError, InvalidOpaqueConfigError
from shared.pb.drasuite.v1 import inventory_pb2

__all__ = [
    "ON_DEMAND",
    "OnDemandOption",
    "Partition",
    "PartitionFactory",
    "PartitionManager",
    "PartitionSettings",
    "invalid_profile",
    "on_demand_option",
]

ON_DEMAND = "createdOnDemand"
"""Bool attribute of an option made at prepare time (discovery's `mig_devices.ON_DEMAND`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Partition:
    """One partition of a device, made for one claim."""

    claim_uid: str
    device: str
    """Name of the (whole) device it was carved from."""
    profile: str
    id: str
    """The backend's identity of the partition: a `MIG-<uuid>`, a vNPU id."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Variables a container needs to use the partition (they override the device's)."""
    device_nodes: tuple[tuple[str, str], ...] = ()
    """(path in the container, host path) the container needs: all of them, the device's own
    included where the partition needs them (a MIG device needs its parent's node)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class OnDemandOption:
    """What an option made on demand asks for: a partition of `parent` at `placement`."""

    parent: str
    profile: str
    placement: int | None
    """The first memory slice of a MIG slot; None for a partition with no placement (a vNPU
    template: the manager picks the vNPU id)."""


def on_demand_option(device: inventory_pb2.Device, *, claim_uid: str) -> OnDemandOption | None:
    """The partition `device` stands for when it is an option made on demand, else None.

    An option lacking its parent or profile, or a MIG slot lacking its placement, fails the
    claim (never guessed at).
    """
    flag = device.attributes.get(ON_DEMAND)
    if flag is None or not flag.bool:
        return None
    profile = device.attributes.get("profile")
    start = device.attributes.get("placementStart")
    placed = device.kind == "mig" or start is not None
    missing = [
        name
        for name, absent in (
            ("parent", not device.parent),
            ("profile", profile is None or not profile.string),
            ("placementStart", placed and (start is None or start.WhichOneof("value") != "int")),
        )
        if absent
    ]
    if missing or profile is None:
        raise ClaimError(
            f"claim {claim_uid}: device {device.name} is made on demand but the inventory "
            f"gives it no {', '.join(missing)}",
            claim_uid=claim_uid,
        )
    placement = start.int if start is not None else None
    return OnDemandOption(parent=device.parent, profile=profile.string, placement=placement)


class PartitionManager(Protocol):
    """A backend's maker of partitions. Callers hold the claim's lock and the instance lock.

    `placement` (the first memory slice of a MIG placement) is where an option made on demand
    must be made, exactly; None lets the manager choose. Creation is idempotent by (claim UID,
    device, placement).
    """

    def supports(self, backend: str) -> bool:
        """Whether this manager makes partitions of devices found by `backend`."""
        ...

    def check(
        self,
        *,
        claim_uid: str,
        device: inventory_pb2.Device,
        profile: str,
        placement: int | None = None,
    ) -> None:
        """Raise InvalidOpaqueConfigError when `device` has no profile `profile`, or a
        ClaimError when it cannot have one at `placement` (no I/O)."""
        ...

    async def create(
        self,
        *,
        claim_uid: str,
        device: inventory_pb2.Device,
        profile: str,
        placement: int | None = None,
    ) -> Partition:
        """Make the partition, or return the one made before for (claim, device, placement);
        ClaimError when `placement` is taken."""
        ...

    async def delete_claim(self, claim_uid: str) -> list[Partition]:
        """Remove every partition of the claim; none left is fine (idempotent)."""
        ...

    async def partitions(self) -> list[Partition]:
        """Every partition that exists, for the orphan sweep at start."""
        ...


class PartitionSettings(Protocol):
    """The allocation agent's settings a manager factory reads (its config satisfies this)."""

    @property
    def data_dir(self) -> Path:
        """The plugin's own data directory: each manager keeps its state file there."""
        ...

    @property
    def npu_smi_path(self) -> str: ...
    @property
    def partition_timeout_s(self) -> float: ...


PartitionFactory = Callable[[PartitionSettings], PartitionManager]
"""Makes a vendor's partition manager; it opens no library before its first partition."""


def invalid_profile(claim_uid: str, reason: str) -> InvalidOpaqueConfigError:
    """A claim's `partition.profile` that this device cannot take, as the claim's own error."""
    return InvalidOpaqueConfigError(
        f"partition.profile: {reason}", claim_uid=claim_uid, field="partition.profile"
    )
