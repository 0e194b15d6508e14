"""A vendor's CDI part: the container edits of one device, and what the allowlist admits (pure).

`BackendEdits` turns one allocated inventory device into the edits a container gets
(`ContainerEdits`), bound to what the device may name (`Own`); `EditRules` is everything the
backend may ever put into a container. The allocation agent joins the edits of a claim's
devices, adds its own variables and checks the result against the rules
(`services/allocation/cdi`). The helpers below are the ones every vendor's edits share.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from shared.pb.drasuite.v1 import inventory_pb2
from shared.vendors.parts.partitions import ON_DEMAND, Partition

__all__ = [
    "BackendEdits",
    "ContainerEdits",
    "EditRules",
    "Node",
    "Own",
    "device_number",
    "foreign",
    "host_paths",
    "listed",
    "made_on_demand",
    "visible",
]

Node = tuple[str, str]
"""(container path, host path; empty host path = same path)."""


def _no_nodes(_: Partition) -> frozenset[str]:
    return frozenset()


_NUMBER = re.compile(r".*-([0-9]{1,5})", re.ASCII | re.DOTALL)


@dataclass(frozen=True, slots=True, kw_only=True)
class Own:
    """What one allocated device (or the partition made of it) may name, from the device's
    own name and the backend's view of it, never from an inventory list of others."""

    nodes: frozenset[str] = frozenset()
    """Its numbered device nodes: `/dev/davinci<id>`, `/dev/nvidia<minor>`, its MIG caps."""
    visible: frozenset[str] = frozenset()
    """`NAME=value` of its visible-devices variables: one id each."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ContainerEdits:
    """One device's edits as its backend makes them."""

    env: dict[str, str]
    nodes: list[Node]
    common: list[Node] = field(default_factory=list)
    """Nodes the whole spec gets once (control nodes)."""
    own: Own = field(default_factory=Own)
    """What the device may name (its own numbered nodes and visible ids)."""
    vendor: bool = True
    """False: a kind the backend never makes (no vendor edit passes)."""


class BackendEdits(Protocol):
    """A vendor's edits of one device; ClaimError when the device cannot be handed out."""

    def __call__(
        self, device: inventory_pb2.Device, *, claim_uid: str, partitioned: bool
    ) -> ContainerEdits: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class EditRules:
    """What one backend may put into a container, besides the driver's own variables."""

    nodes: tuple[re.Pattern[str], ...]
    """Container paths of device nodes (full match)."""
    env: Mapping[str, re.Pattern[str]]
    """The vendor's variables and the shape of each one's value (full match)."""
    visible: frozenset[str] = frozenset()
    """Those of `env` that select devices: per device, only its own id (`Own.visible`)."""
    numbered: tuple[re.Pattern[str], ...] = ()
    """Device nodes that name one device: they must be the device's own (`Own.nodes`)."""
    host_aliases: tuple[tuple[re.Pattern[str], str], ...] = ()
    """(container path, host path template): another host path such a node may have, e.g.
    a static vNPU's `/dev/vdavinci<N>` seen as `/dev/davinci<N>`."""
    sim_host: bool = False
    """Every host path is the sim's `/dev/null` (sim nodes are never real)."""
    mps: bool = False
    """The allocation agent's MPS daemon variables may be handed out (NVIDIA GPUs)."""
    partition_nodes: Callable[[Partition], frozenset[str]] = _no_nodes
    """The numbered nodes a partition made for the claim names as its own (its MIG
    capabilities, its vNPU node), besides those of the device it was carved from."""


def listed(item: str) -> re.Pattern[str]:
    """A comma-separated list of `item`s (full match), as visible-devices variables are."""
    return re.compile(rf"{item}(,{item})*", re.ASCII)


def host_paths(device: inventory_pb2.Device) -> dict[str, str]:
    """Container path -> host path of the device's nodes as published."""
    return {node.path: node.host_path for node in device.device_nodes}


def device_number(name: str) -> str | None:
    """The device's number in its name: `npu-3` -> `3`; None without one."""
    match = _NUMBER.fullmatch(name)
    return str(int(match.group(1))) if match is not None else None


def made_on_demand(device: inventory_pb2.Device) -> bool:
    flag = device.attributes.get(ON_DEMAND)
    return flag is not None and flag.bool


def visible(name: str, *values: str) -> frozenset[str]:
    """`Own.visible` entries: `name=value` for each value."""
    return frozenset(f"{name}={value}" for value in values)


def foreign(device: inventory_pb2.Device) -> ContainerEdits:
    """A kind the backend never makes: its edits as published, none of which may be a vendor's."""
    nodes = [(n.path, n.host_path) for n in device.device_nodes]
    return ContainerEdits(env=dict(device.env), nodes=nodes, vendor=False)
