"""`dractl inventory`: the devices the discovery agent published for a node, or for every
node (`--all-nodes`, or a glob in `--node-name`) with a NODE column."""

from __future__ import annotations

import argparse
from typing import TextIO

from services.dractl import fleet, queries
from services.dractl.bus_session import bus_session
from services.dractl.document import Item
from services.dractl.output import Output, listing
from services.dractl.render import Column, fleet_columns, pairs
from services.dractl.subcommands import Subcommands
from shared.pb.drasuite.v1 import inventory_pb2

__all__ = ["NAME", "columns", "devices", "register", "run"]

NAME = "inventory"


def register(subcommands: Subcommands) -> None:
    text = "devices the discovery agent published"
    parser = subcommands.add(NAME, summary=text, description=text)
    fleet.add_all_nodes_flag(parser)


async def run(args: argparse.Namespace, *, out: TextIO, err: TextIO) -> int:
    output = Output.of(args.output, out=out, err=err)
    driver = args.driver_name
    async with bus_session(args) as bus:
        glob = fleet.node_glob(args)
        if glob is None:
            items = devices(await queries.inventory(bus, driver=driver, node=args.node_name))
            listing(items, columns(), output, empty="")
        else:
            nodes = await fleet.inventories(bus, driver=driver, node_glob=glob)
            items = [item for inv in nodes for item in devices(inv)]
            empty = f"no inventory on any node {fleet.where(glob, driver=driver)}"
            listing(items, fleet_columns(columns()), output, empty=empty)
        _unpublished_note(items, output)
    return 0


def columns() -> list[Column]:
    return [
        Column("DEVICE", lambda d: d["name"]),
        Column("KIND", lambda d: d["kind"]),
        Column("CAPACITY", lambda d: pairs(d["capacity"])),
        Column("PUBLISHED", lambda d: "yes" if d["published"] else "no"),
        Column("POOL", lambda d: d["pool"], wide=True),
        Column("ATTRIBUTES", lambda d: pairs(d["attributes"]), wide=True),
        Column("UNPUBLISHED", lambda d: d["unpublished"] or "-", wide=True),
    ]


def devices(inv: inventory_pb2.Inventory) -> list[Item]:
    """One item per device of the inventory (`-o json|yaml`, and a table's rows)."""
    return [_device(inv, dev) for dev in inv.devices]


def _device(inv: inventory_pb2.Inventory, dev: inventory_pb2.Device) -> Item:
    return {
        "driver": inv.driver,
        "node": inv.node,
        "pool": inv.pool,
        "generation": inv.generation,
        "name": dev.name,
        "kind": dev.kind,
        "capacity": dict(sorted(dev.capacity.items())),
        "attributes": {k: _attribute(v) for k, v in sorted(dev.attributes.items())},
        # The discovery agent marks a device it leaves out of the ResourceSlices.
        "published": not dev.unpublished,
        "unpublished": dev.unpublished or None,
    }


def _attribute(value: inventory_pb2.AttributeValue) -> object:
    kind = value.WhichOneof("value")
    return None if kind is None else getattr(value, kind)


def _unpublished_note(items: list[Item], output: Output) -> None:
    """Under a table: how many devices the scheduler cannot see, and where to read why."""
    left_out = sum(1 for item in items if not item["published"])
    if output.tabular and left_out:
        why = "the UNPUBLISHED column" if output.wide else "-o wide"
        output.err.write(
            f"{left_out} device(s) not published in ResourceSlices (the scheduler cannot "
            f"allocate them): see {why} and the Node's Events.\n"
        )
