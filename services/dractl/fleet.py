"""What dractl reads across nodes (`inventory` and `health` with `--all-nodes`, or a glob in
`--node-name`): the latest value of every key of the driver, in one pass.

One ordered consumer per bucket replays them (a request per key would take minutes on 5,000
nodes). A value that names another driver or node than its key is skipped with a line on
stderr, as for one node. Read-only: a missing bucket is "no data yet", never created.
"""

from __future__ import annotations

import argparse
import fnmatch
from collections.abc import Callable
from typing import TypeVar

from google.protobuf.message import Message

from services.dractl import queries
from shared.bus import codec, reading
from shared.bus.connection import Bus
from shared.bus.subjects import token
from shared.errors import MalformedMessageError
from shared.pb.drasuite.v1 import inventory_pb2

__all__ = ["add_all_nodes_flag", "decoded", "inventories", "is_glob", "latest", "node_glob"]

M = TypeVar("M", bound=Message)
_GLOB = frozenset("*?[")


def add_all_nodes_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-A",
        "--all-nodes",
        action="store_true",
        help="every node of the driver (a NODE column); --node-name may be a glob",
    )


def is_glob(node: str) -> bool:
    return any(char in _GLOB for char in node)


def node_glob(args: argparse.Namespace) -> str | None:
    """The nodes asked about when more than one: `--node-name` when it is a glob, every node
    (`*`) with `--all-nodes`; None for one node."""
    if is_glob(args.node_name):
        return str(args.node_name)
    return "*" if args.all_nodes else None


def where(glob: str, *, driver: str) -> str:
    """Which nodes were asked about, for an empty listing's message."""
    return f"matching {glob}" if glob != "*" else f"for driver {driver}"


async def latest(
    bus: Bus,
    bucket: str,
    driver: str,
    *,
    skipped: Callable[[MalformedMessageError], None] = queries.to_stderr,
) -> list[tuple[str, bytes]]:
    """(key, value) of every live key of `driver` in `bucket`; with signatures on, a value
    not signed by its key's owner goes to `skipped`, as one that does not decode."""

    def refused(key: str, reason: str) -> None:
        skipped(MalformedMessageError(f"{key}: not signed by its owner ({reason})", subject=key))

    return await reading.latest_values(bus, bucket, f"{token(driver)}.>", refused=refused)


def decoded(
    entries: list[tuple[str, bytes]],
    kind: type[M],
    *,
    node_glob: str,
    skipped: Callable[[MalformedMessageError], None],
) -> list[M]:
    """The values of `entries` of the nodes matching `node_glob`; one that does not decode or
    names another key's driver or node goes to `skipped`."""
    messages = []
    for key, data in entries:
        try:
            message = codec.decode(kind, data, subject=key)
            queries.check_key(message, key)
        except MalformedMessageError as exc:  # the other keys' values still count
            skipped(exc)
            continue
        if fnmatch.fnmatchcase(getattr(message, "node", ""), node_glob):
            messages.append(message)
    return messages


async def inventories(
    bus: Bus,
    *,
    driver: str,
    node_glob: str = "*",
    skipped: Callable[[MalformedMessageError], None] = queries.to_stderr,
) -> list[inventory_pb2.Inventory]:
    """Every matching node's inventory, by node name."""
    entries = await latest(bus, bus.names.inventory_bucket, driver, skipped=skipped)
    found = decoded(entries, inventory_pb2.Inventory, node_glob=node_glob, skipped=skipped)
    return sorted(found, key=lambda inv: inv.node)
