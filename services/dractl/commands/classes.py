"""`dractl classes generate`: DeviceClasses that match what the fleet publishes.

Reads the ResourceSlices from the API server (kubeconfig, as `dractl explain` does), takes
the devices of every pool's newest generation, on every node or one (`--node`), and writes one
DeviceClass per device model, published partition profile and sharing mode (`classgen`) for
the Kubernetes version of the server, or `--kubernetes-version`: YAML documents (`-o yaml`,
the default) or a `v1` List (`-o json`), ready for `kubectl apply -f -`. A summary and notes
go to stderr. Exit 0 with the classes; 1 when no slice publishes a device (on the node) or the
server cannot be read; 2 on bad flags.
"""

from __future__ import annotations

import argparse
import re
from typing import TextIO

from services.dractl.classgen_backends import BACKENDS
from services.dractl.subcommands import Subcommands
from shared.config import KubeSettings, add_arguments

__all__ = ["NAME", "NEWEST", "OLDEST", "VERSION", "kubernetes_minor", "register", "run"]

NAME = "classes"
OLDEST, NEWEST = 34, 37
"""The Kubernetes minors dra-suite supports (docs/contracts.md)."""
VERSION = re.compile(r"^v?1\.(\d+)(?:\.\d+)?$")
"""`1.36`, `v1.36` or `1.36.2`: the minor in group 1."""


def kubernetes_minor(text: str) -> int:
    """`1.36`, `v1.36` or `1.36.2` -> 36, for 1.34-1.37 (argparse's type: ValueError else)."""
    match = VERSION.match(text.strip())
    if match is None or not OLDEST <= int(match.group(1)) <= NEWEST:
        raise argparse.ArgumentTypeError(f"{text!r}: want 1.{OLDEST} to 1.{NEWEST}")
    return int(match.group(1))


def register(subcommands: Subcommands) -> None:
    """`classes generate`; the global flags may follow it."""
    text = "DeviceClasses generated from the devices the fleet publishes"
    description = (
        f"{text}: one per device model, published partition profile and sharing mode, read "
        "from the ResourceSlices; YAML documents (-o yaml, the default) or a v1 List (-o json) "
        "for kubectl apply -f -."
    )
    parser = subcommands.add(NAME, summary=text, description=description)
    parser.add_argument("action", choices=("generate",))
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--node", help="only the devices this node's slices publish")
    where.add_argument("--all-nodes", action="store_true", help="every node (the default)")
    parser.add_argument(
        "--kubernetes-version",
        type=kubernetes_minor,
        metavar="1.34..1.37",
        help="the version the classes are for (default: the API server's)",
    )
    parser.add_argument(
        "--backend",
        action="append",
        default=[],
        metavar="DRIVER=BACKEND",
        help="the backend (sim, nvml, ascend) of a driver's nodes, for the device-plugin "
        "resource annotation (known: " + ", ".join(f"{d}={b}" for d, b in BACKENDS.items()) + ")",
    )
    add_arguments(parser, KubeSettings)


async def run(
    args: argparse.Namespace, *, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """The subcommand (reads the API server, not the bus): the classes on `out` (stdout), the
    summary and notes on `err` (stderr)."""
    # Here, not at the top: the allocator and the Kubernetes client load only for classes.
    from services.dractl import classes_command

    return await classes_command.run(args, out=out, err=err)
