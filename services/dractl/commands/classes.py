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
import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

import yaml

from services.allocator.device import Device
from services.allocator.pool import Inventory
from services.dractl import classgen
from services.dractl.subcommands import Subcommands
from shared.config import KubeSettings, add_arguments, from_args
from shared.errors import ConfigError, DraSuiteError
from shared.kube import resources
from shared.kube.client import KubeClient

__all__ = ["NAME", "NEWEST", "OLDEST", "kubernetes_minor", "register", "run"]

NAME = "classes"
Obj = dict[str, Any]
OLDEST, NEWEST = 34, 37
"""The Kubernetes minors dra-suite supports (docs/contracts.md)."""
EXIT_DONE, EXIT_NOTHING, EXIT_BAD_INPUT = 0, 1, 2
BACKEND_NAMES = ("sim", "nvml", "ascend")
_VERSION = re.compile(r"^v?1\.(\d+)(?:\.\d+)?$")
_DIGITS = re.compile(r"^\d+")


class _BadInput(Exception):
    """What `dractl classes` was given cannot be used."""


def kubernetes_minor(text: str) -> int:
    """`1.36`, `v1.36` or `1.36.2` -> 36, for 1.34-1.37 (argparse's type: ValueError else)."""
    match = _VERSION.match(text.strip())
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
        "resource annotation (known: "
        + ", ".join(f"{d}={b}" for d, b in classgen.BACKENDS.items())
        + ")",
    )
    add_arguments(parser, KubeSettings)


async def run(
    args: argparse.Namespace, *, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """The subcommand (reads the API server, not the bus): the classes on `out` (stdout), the
    summary and notes on `err` (stderr)."""
    out = out or sys.stdout
    err = err or sys.stderr
    output = getattr(args, "output", None) or "table"
    try:
        if output not in ("table", "yaml", "json"):
            raise _BadInput(f"-o {output}: the classes are written as yaml or json")
        backends = _backends(args.backend)
        settings = from_args(KubeSettings, args, os.environ)
    except (_BadInput, ConfigError) as exc:
        print(f"dractl classes: {exc}", file=err)
        return EXIT_BAD_INPUT
    try:
        kube = await KubeClient.connect(settings)
        try:
            slices = (await kube.list(resources.RESOURCE_SLICES))["items"]
            minor = args.kubernetes_version or await _server_minor(kube, err)
        finally:
            await kube.close()
    except ConfigError as exc:
        print(f"dractl classes: {exc}", file=err)
        return EXIT_BAD_INPUT
    except DraSuiteError as exc:
        print(f"dractl classes: cannot read the cluster: {exc}", file=err)
        return EXIT_NOTHING
    devices, problem = _devices(slices, node=args.node)
    if problem:
        print(f"dractl classes: {problem}", file=err)
        return EXIT_NOTHING
    generated = classgen.generate(devices, minor=minor, backends=backends)
    for note in generated.notes:
        print(f"dractl classes: note: {note}", file=err)
    _write(generated.classes, output="json" if output == "json" else "yaml", out=out)
    pools = len({(d.driver, d.pool) for d in devices})
    print(
        f"dractl classes: {len(generated.classes)} DeviceClasses for {len(devices)} devices "
        f"in {pools} pool{'s' if pools != 1 else ''}, Kubernetes 1.{minor}",
        file=err,
    )
    return EXIT_DONE


def _backends(entries: Sequence[str]) -> dict[str, str]:
    backends: dict[str, str] = {}
    for entry in entries:
        driver, sep, backend = entry.partition("=")
        if not sep or not driver.strip() or backend.strip() not in BACKEND_NAMES:
            raise _BadInput(f"--backend {entry!r}: want DRIVER=sim|nvml|ascend")
        backends[driver.strip()] = backend.strip()
    return backends


async def _server_minor(kube: KubeClient, err: TextIO) -> int:
    """The server's minor version, brought into 1.34-1.37 with a note when outside."""
    version: Mapping[str, Any] = await kube.get_path("/version")
    minor: int | None = None
    if match := _DIGITS.match(str(version.get("minor", ""))):
        minor = int(match.group())
    elif match := _VERSION.match(str(version.get("gitVersion", "")).split("-", 1)[0]):
        minor = int(match.group(1))
    if minor is None:
        print(
            f"dractl classes: note: the server's version {dict(version)} is unreadable: "
            f"classes for 1.{NEWEST} (--kubernetes-version to choose)",
            file=err,
        )
        return NEWEST
    if not OLDEST <= minor <= NEWEST:
        near = min(max(minor, OLDEST), NEWEST)
        print(f"dractl classes: note: the server is 1.{minor}: classes for 1.{near}", file=err)
        return near
    return minor


def _devices(slices: Sequence[Obj], *, node: str | None) -> tuple[list[Device], str]:
    """The devices of every pool's newest generation (those the node sees with `node`), or
    why there are none."""
    if not slices:
        return [], "no ResourceSlices: no driver publishes devices in this cluster"
    inventory = Inventory(slices)
    if node is None:
        devices = inventory.devices()
    elif node not in inventory.nodes:
        listed = ", ".join(inventory.nodes[:10]) + (", ..." if len(inventory.nodes) > 10 else "")
        return [], f"no ResourceSlice names node {node} (nodes with devices: {listed or 'none'})"
    else:
        devices = [d for pool in inventory.pools(node) for d in pool.devices]
    if not devices:
        where = f"node {node}" if node else "any node"
        return [], f"the ResourceSlices publish no devices for {where}"
    return devices, ""


def _write(classes: Sequence[Obj], *, output: str, out: TextIO) -> None:
    if output == "json":
        json.dump({"apiVersion": "v1", "kind": "List", "items": list(classes)}, out, indent=2)
        out.write("\n")
    else:
        yaml.safe_dump_all(classes, out, sort_keys=False, explicit_start=True, width=1000)
