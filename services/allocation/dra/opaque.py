"""Opaque claim configuration of this driver: `<driver>/v1alpha1`, kind `DeviceConfig` (pure).

Decoding is strict: an unknown field, a wrong type or a value out of range is an
`InvalidOpaqueConfigError` whose `field` is the path of the offending field
(`sharing.timeSlicing.interval`). Configs apply in the order the allocation lists them (class
configs, then claim configs); for each request the last config naming it (or naming no request)
wins as a whole. The result becomes container environment in the CDI edits, and is kept in the
checkpoint in its normalised form (`encode`), so a repeated prepare answers the same.

Hand-written on purpose: the same rules as a JSON Schema (jsonschema, already a dependency)
came out longer once every error names its field and carries a shortened value, and decoded
six times slower on the prepare path (260 against 44 µs a config).

    apiVersion: sim.dra-suite.io/v1alpha1
    kind: DeviceConfig
    sharing:
      strategy: TimeSlicing            # Exclusive (default) | TimeSlicing | SpacePartitioning
      timeSlicing: {interval: Short}   # Default | Short | Medium | Long
      # spacePartitioning: {computePercent: 50, memoryLimit: 10Gi}
    partition: {profile: 1g.10gb}      # optional: a partition of each device, made at prepare
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from decimal import ROUND_DOWN
from typing import Any, TypeVar

from services.allocation.dra.claims import OpaqueConfig
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
E = TypeVar("E", bound=enum.StrEnum)
# A MIG profile (`1g.10gb+me`) or a vNPU template (`vir05_1c_8g`); which exist is the backend's.
_PROFILE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._+-]{0,61}[A-Za-z0-9])?")
_NVIDIA_KINDS = frozenset({"gpu"})
# Kubernetes keeps quantities it can as int64; a larger limit is a typo (and would not even fit
# in an environment variable: Python refuses to print ints of more than 4300 digits).
_MAX_BYTES = 2**63 - 1


class Strategy(enum.StrEnum):
    EXCLUSIVE = "Exclusive"
    TIME_SLICING = "TimeSlicing"
    SPACE_PARTITIONING = "SpacePartitioning"


class Interval(enum.StrEnum):
    DEFAULT = "Default"
    SHORT = "Short"
    MEDIUM = "Medium"
    LONG = "Long"


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

    @property
    def memory_limit_bytes(self) -> int | None:
        return None if self.memory_limit is None else _quantity_bytes(self.memory_limit)


def api_version(driver: str) -> str:
    """Our own API group is the driver name: `sim.dra-suite.io/v1alpha1`."""
    return f"{driver}/{VERSION}"


class _Invalid(Exception):
    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field


def decode(parameters: Mapping[str, Any], *, driver: str, claim_uid: str = "") -> DeviceConfig:
    """Decode one `opaque.parameters` object strictly; raises InvalidOpaqueConfigError."""
    try:
        return _decode(parameters, driver=driver)
    except _Invalid as exc:
        raise InvalidOpaqueConfigError(
            f"invalid opaque config: {exc}", claim_uid=claim_uid, field=exc.field
        ) from None


def _decode(parameters: Mapping[str, Any], *, driver: str) -> DeviceConfig:
    document = _object(parameters, "")
    _known(document, "", {"apiVersion", "kind", "sharing", "partition"})
    expected = api_version(driver)
    if document.get("apiVersion") != expected:
        raise _Invalid(
            "apiVersion", f"{_shortened(document.get('apiVersion'))}, expected {expected!r}"
        )
    if document.get("kind") != KIND:
        raise _Invalid("kind", f"{_shortened(document.get('kind'))}, expected {KIND!r}")
    profile = _partition(document["partition"]) if "partition" in document else None
    config = _sharing(document["sharing"]) if "sharing" in document else DeviceConfig()
    return replace(config, partition_profile=profile)


def _partition(raw: Any) -> str:
    block = _object(raw, "partition")
    _known(block, "partition", {"profile"})
    profile = block.get("profile")
    if not isinstance(profile, str) or not _PROFILE.fullmatch(profile):
        raise _Invalid(
            "partition.profile",
            f"{_shortened(profile)} is not a profile name (letters, digits, ._+-)",
        )
    return profile


def _sharing(raw: Any) -> DeviceConfig:
    sharing = _object(raw, "sharing")
    _known(sharing, "sharing", {"strategy", "timeSlicing", "spacePartitioning"})
    strategy = _enum(sharing.get("strategy", "Exclusive"), Strategy, "sharing.strategy")
    for block, owner in (
        ("timeSlicing", Strategy.TIME_SLICING),
        ("spacePartitioning", Strategy.SPACE_PARTITIONING),
    ):
        if block in sharing and strategy is not owner:
            raise _Invalid(f"sharing.{block}", f"only allowed with strategy {owner}")
    if strategy is Strategy.TIME_SLICING:
        slicing = _object(sharing.get("timeSlicing", {}), "sharing.timeSlicing")
        _known(slicing, "sharing.timeSlicing", {"interval"})
        path = "sharing.timeSlicing.interval"
        interval = _enum(slicing.get("interval", "Default"), Interval, path)
        return DeviceConfig(strategy=strategy, interval=interval)
    if strategy is Strategy.SPACE_PARTITIONING:
        return _space_partitioning(sharing.get("spacePartitioning", {}))
    return DeviceConfig(strategy=strategy)


def _space_partitioning(raw: Any) -> DeviceConfig:
    path = "sharing.spacePartitioning"
    block = _object(raw, path)
    _known(block, path, {"computePercent", "memoryLimit"})
    percent = block.get("computePercent")
    if percent is not None and (
        isinstance(percent, bool) or not isinstance(percent, int) or not 1 <= percent <= 100
    ):
        raise _Invalid(
            f"{path}.computePercent", f"{_shortened(percent)} is not an integer in 1..100"
        )
    limit = block.get("memoryLimit")
    if limit is not None and (
        not isinstance(limit, str) or not 1 <= _quantity_bytes(limit) <= _MAX_BYTES
    ):
        raise _Invalid(
            f"{path}.memoryLimit", f"{_shortened(limit)} is not a positive quantity up to 8Ei"
        )
    return DeviceConfig(
        strategy=Strategy.SPACE_PARTITIONING, compute_percent=percent, memory_limit=limit
    )


def _shortened(value: Any) -> str:
    """`repr(value)`, cut to a length an error message can carry."""
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


def _object(value: Any, path: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _Invalid(path or "parameters", f"expected an object, got {type(value).__name__}")
    return value


def _known(document: Mapping[str, Any], path: str, allowed: set[str]) -> None:
    for key in sorted(set(document) - allowed):
        raise _Invalid(f"{path}.{key}" if path else str(key), "unknown field")


def _enum(value: Any, cls: type[E], path: str) -> E:
    choices = ", ".join(member.value for member in cls)
    if not isinstance(value, str):
        raise _Invalid(path, f"expected a string, one of {choices}")
    try:
        return cls(value)
    except ValueError:
        raise _Invalid(path, f"{_shortened(value)} is not one of {choices}") from None


def _quantity_bytes(text: str) -> int:
    """Whole bytes of a quantity (a fraction dropped); 0 for what is not one and one past int64
    for what is beyond it, both rejected by the caller."""
    try:
        value = quantity.parse(text)
    except quantity.QuantityError:
        return 0
    bytes_ = quantity.as_int(value.to_integral_value(rounding=ROUND_DOWN))
    return _MAX_BYTES + 1 if bytes_ is None else bytes_


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
    return document
