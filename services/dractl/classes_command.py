"""What `dractl classes generate` does once its flags are parsed
(services/dractl/commands/classes.py: the command, its flags and exit codes): read the
ResourceSlices and the server's version, generate the classes (`classgen`), write them."""

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
from services.dractl.commands.classes import NEWEST, OLDEST, VERSION
from shared.config import KubeSettings, from_args
from shared.errors import ConfigError, DraSuiteError
from shared.kube import resources
from shared.kube.client import KubeClient

__all__ = ["run"]

Obj = dict[str, Any]
EXIT_DONE, EXIT_NOTHING, EXIT_BAD_INPUT = 0, 1, 2
BACKEND_NAMES = ("sim", "nvml", "ascend")
_DIGITS = re.compile(r"^\d+")


class _BadInput(Exception):
    """What `dractl classes` was given cannot be used."""


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
    elif match := VERSION.match(str(version.get("gitVersion", "")).split("-", 1)[0]):
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
