"""Opaque claim configuration of this driver: `<driver>/v1alpha1`, kind `DeviceConfig` (pure).

Decoding is strict, by the schema in config_schema.py, the one the admission policy is
generated from: an unknown field, a wrong type or a value out of range is an
`InvalidOpaqueConfigError` whose `field` is the path of the offending field
(`sharing.timeSlicing.interval`). Configs apply in the order the allocation lists them (class
configs, then claim configs); for each request the last config naming it (or naming no request)
wins as a whole. The result becomes container environment in the CDI edits, and is kept in the
checkpoint in its normalised form (`encode`), so a repeated prepare answers the same.

    apiVersion: sim.dra-suite.io/v1alpha1
    kind: DeviceConfig
    sharing:
      strategy: TimeSlicing            # Exclusive (default) | TimeSlicing | SpacePartitioning
      timeSlicing: {interval: Short}   # Default | Short | Medium | Long
      # spacePartitioning: {computePercent: 50, memoryLimit: 10Gi}
    partition: {profile: 1g.10gb}      # optional: a partition of each device, made at prepare
    passthrough: vfio                  # optional: for a virtual machine (docs/vfio.md)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from decimal import ROUND_DOWN
from typing import Any

from services.allocation.claim import config_schema
from services.allocation.claim.claims import OpaqueConfig
from services.allocation.claim.config_schema import Interval, Strategy
from shared import quantity
from shared.errors import InvalidOpaqueConfigError

__all__ = [
    "COMPUTE_PERCENT_ENV",
    "KIND",
    "MEMORY_LIMIT_ENV",
    "MPS_MEMORY_LIMIT_ENV",
    "MPS_THREAD_PERCENTAGE_ENV",
    "STRATEGY_ENV",
    "TIMESLICE_INTERVAL_ENV",
    "VERSION",
    "DeviceConfig",
    "Interval",
    "Strategy",
    "api_version",
    "container_env",
    "decode",
    "encode",
    "is_nvidia_kind",
    "resolve",
]

VERSION = "v1alpha1"
KIND = "DeviceConfig"
STRATEGY_ENV = "DRA_SUITE_SHARING_STRATEGY"
TIMESLICE_INTERVAL_ENV = "DRA_SUITE_TIMESLICE_INTERVAL"
COMPUTE_PERCENT_ENV = "DRA_SUITE_COMPUTE_PERCENT"
MEMORY_LIMIT_ENV = "DRA_SUITE_MEMORY_LIMIT"
MPS_THREAD_PERCENTAGE_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
MPS_MEMORY_LIMIT_ENV = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
_NVIDIA_KINDS = frozenset({"gpu"})


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceConfig:
    """A decoded, validated DeviceConfig; fields not meaningful for the strategy are None."""

    strategy: Strategy = Strategy.EXCLUSIVE
    interval: Interval | None = None
    """TimeSlicing only; `Default` when the block or the field is omitted."""
    compute_percent: int | None = None
    """SpacePartitioning only: share of compute units, 1..100."""
    memory_limit: str | None = None
    """SpacePartitioning only: a Kubernetes quantity, as written."""
    partition_profile: str | None = None
    """`partition.profile`: prepare makes a partition of this profile of each device."""
    passthrough: str | None = None
    """`vfio`: each device is bound to vfio-pci for a virtual machine (docs/vfio.md)."""

    @property
    def memory_limit_bytes(self) -> int | None:
        return None if self.memory_limit is None else _quantity_bytes(self.memory_limit)


def api_version(driver: str) -> str:
    """Our own API group is the driver name: `sim.dra-suite.io/v1alpha1`."""
    return f"{driver}/{VERSION}"


def decode(parameters: Mapping[str, Any], *, driver: str, claim_uid: str = "") -> DeviceConfig:
    """Decode one `opaque.parameters` object strictly; raises InvalidOpaqueConfigError."""
    try:
        document = config_schema.check(parameters, driver=driver)
    except config_schema.Violation as exc:
        raise InvalidOpaqueConfigError(
            f"invalid opaque config: {exc}", claim_uid=claim_uid, field=exc.field
        ) from None
    return _read(document)


def _read(document: Mapping[str, Any]) -> DeviceConfig:
    """The DeviceConfig of a document that passed the schema."""
    config = _read_sharing(document)
    if "passthrough" in document:
        return replace(config, passthrough=document["passthrough"])
    return config


def _read_sharing(document: Mapping[str, Any]) -> DeviceConfig:
    profile = document["partition"]["profile"] if "partition" in document else None
    sharing = document.get("sharing", {})
    strategy = Strategy(sharing.get("strategy", Strategy.EXCLUSIVE))
    if strategy is Strategy.TIME_SLICING:
        interval = Interval(sharing.get("timeSlicing", {}).get("interval", Interval.DEFAULT))
        return DeviceConfig(strategy=strategy, interval=interval, partition_profile=profile)
    if strategy is Strategy.SPACE_PARTITIONING:
        block = sharing.get("spacePartitioning", {})
        return DeviceConfig(
            strategy=strategy,
            compute_percent=block.get("computePercent"),
            memory_limit=block.get("memoryLimit"),
            partition_profile=profile,
        )
    return DeviceConfig(strategy=strategy, partition_profile=profile)


def _quantity_bytes(text: str) -> int:
    """Whole bytes of a quantity the schema accepted (a fraction dropped)."""
    bytes_ = quantity.as_int(quantity.parse(text).to_integral_value(rounding=ROUND_DOWN))
    if bytes_ is None:
        raise ValueError(f"memory limit {text!r} is beyond int64, which the schema refuses")
    return bytes_


def resolve(
    configs: Sequence[OpaqueConfig], requests: Sequence[str], *, driver: str, claim_uid: str
) -> dict[str, DeviceConfig]:
    """The config in force for each request that has one; every config is decoded (strictly).

    `configs` come in allocation order (class first, then claim), so a later one overrides an
    earlier one for the requests it names.
    """
    decoded = []
    for index, config in enumerate(configs):
        try:
            decoded.append((config, decode(config.parameters, driver=driver, claim_uid=claim_uid)))
        except InvalidOpaqueConfigError as exc:
            raise InvalidOpaqueConfigError(
                f"claim {claim_uid}: config #{index} ({config.source or 'unknown source'}): {exc}",
                claim_uid=claim_uid,
                field=exc.field,
            ) from None
    in_force: dict[str, DeviceConfig] = {}
    for request in requests:
        for config, device_config in decoded:
            if config.applies_to(request):
                in_force[request] = device_config
    return in_force


def container_env(config: DeviceConfig, *, nvidia_devices: int) -> dict[str, str]:
    """Environment that carries `config` into the container (MPS variables for NVIDIA kinds).

    `nvidia_devices` is how many NVIDIA-kind devices the request has: the MPS memory limit is
    given per device ordinal, as `0=<MiB>M,1=<MiB>M`.
    """
    env = {STRATEGY_ENV: str(config.strategy)}
    if config.interval is not None:
        env[TIMESLICE_INTERVAL_ENV] = str(config.interval)
    if config.compute_percent is not None:
        env[COMPUTE_PERCENT_ENV] = str(config.compute_percent)
        if nvidia_devices:
            env[MPS_THREAD_PERCENTAGE_ENV] = str(config.compute_percent)
    limit = config.memory_limit_bytes
    if config.memory_limit is not None and limit is not None:
        env[MEMORY_LIMIT_ENV] = str(limit)
        if nvidia_devices:
            mib = max(1, limit // 2**20)
            env[MPS_MEMORY_LIMIT_ENV] = ",".join(f"{i}={mib}M" for i in range(nvidia_devices))
    return env


def is_nvidia_kind(kind: str) -> bool:
    return kind in _NVIDIA_KINDS


def encode(config: DeviceConfig, *, driver: str) -> dict[str, Any]:
    """The normalised DeviceConfig document (defaults spelled out); `decode` reads it back."""
    sharing: dict[str, Any] = {"strategy": str(config.strategy)}
    if config.interval is not None:
        sharing["timeSlicing"] = {"interval": str(config.interval)}
    if config.strategy is Strategy.SPACE_PARTITIONING:
        block: dict[str, Any] = {}
        if config.compute_percent is not None:
            block["computePercent"] = config.compute_percent
        if config.memory_limit is not None:
            block["memoryLimit"] = config.memory_limit
        sharing["spacePartitioning"] = block
    document = {"apiVersion": api_version(driver), "kind": KIND, "sharing": sharing}
    if config.partition_profile is not None:
        document["partition"] = {"profile": config.partition_profile}
    if config.passthrough is not None:
        document["passthrough"] = config.passthrough
    return document
