"""`devcluster`: run the suite on one machine with the embedded defaults (sim, local NATS).

`devcluster demo` walks the spine's flow and exits 0 when every step checked out;
`devcluster up` runs the stack until Ctrl-C (or SIGTERM/SIGHUP) and prints how to reach it;
`devcluster claim` prepares a claim on the stack that `up` runs (`--release` undoes it);
`devcluster load` puts a small steady load on it (claims, prepares, faults) for dashboards.
Each command has its own default work dir, so a demo never disturbs a running `up`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from devcluster import extra
from devcluster.apiserver.config import SUPPORTED_VERSIONS as EMULATED_VERSIONS
from devcluster.claim import ClaimHelperError, ClaimRequest, run_claim
from devcluster.controlplane import (
    ControlPlaneNotBuiltError,
    ControlPlaneStartError,
    cached_binaries,
    release,
)
from devcluster.demo import run_demo
from devcluster.load import LoadPlan, LoadTarget, run_load
from devcluster.natsserver import NATSServerError, find_binary
from devcluster.stack import StackConfig
from devcluster.up import run_up
from devcluster.workdir import (
    NoStackError,
    OrphanedProcessesError,
    WorkdirBusyError,
    read_endpoints,
)
from shared.config import LogSettings
from shared.errors import DraSuiteError
from shared.logging import configure as configure_logging

__all__ = ["main"]

_WORKDIRS = {"demo": Path(".demo"), "up": Path(".up"), "claim": Path(".up"), "load": Path(".up")}
# A terminal's Ctrl-C, a service manager's stop and a closed terminal all stop the stack.
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_INTERRUPTED = 130


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--workdir", type=Path, default=None, help="default: .demo for demo, .up for up and claim"
    )
    stack = argparse.ArgumentParser(add_help=False)
    stack.add_argument("--node-name", default="demo-node")
    stack.add_argument("--sim-profile", default="mixed")
    stack.add_argument(
        "--kubernetes-version",
        default="1.36",
        choices=("1.34", "1.35", "1.36", "1.37"),
        help="the emulator serves 1.34-1.36; the real control plane 1.34-1.37",
    )
    stack.add_argument(
        "--control-plane",
        default="emulator",
        choices=("emulator", "real"),
        help="the embedded API emulator, or the real kube-apiserver, kube-scheduler and "
        "kube-controller-manager built by `make k8s` (pods are then scheduled for real)",
    )
    stack.add_argument(
        "--nats-cluster",
        type=int,
        default=1,
        choices=(1, 3, 5),
        help="nats-servers: 1, or a JetStream cluster of 3 or 5 with replicated buckets",
    )
    parser = argparse.ArgumentParser(
        prog="python -m devcluster",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="{demo,up,claim,load}")
    commands.add_parser("demo", parents=[common, stack], help="walk the flow (the default)")
    commands.add_parser("up", parents=[common, stack], help="run the stack until Ctrl-C")
    claim = commands.add_parser("claim", parents=[common], help="prepare a claim on `up`")
    claim.add_argument("name", nargs="?", default="try-claim", help="the ResourceClaim's name")
    claim.add_argument("--count", type=int, default=1, help="how many devices")
    claim.add_argument("--namespace", default="default")
    claim.add_argument("--release", action="store_true", help="unprepare and delete the claim")
    _load_parser(commands.add_parser("load", parents=[common], help="a steady load on `up`"))
    return parser


def _load_parser(load: argparse.ArgumentParser) -> None:
    """The stack comes from the work dir's endpoints; without a stack there (compose), from
    these flags or their env twins."""
    load.add_argument("--interval-s", type=float, default=2.0, help="pause between rounds")
    load.add_argument("--rounds", type=int, default=0, help="0: until stopped")
    load.add_argument("--fault-every", type=int, default=5, help="a fault every N rounds; 0: none")
    for flag, env in (
        ("--kubeconfig", "KUBECONFIG"),
        ("--nats-url", "NATS_URL"),
        ("--plugin-registry-dir", "PLUGIN_REGISTRY_DIR"),
        ("--driver-name", "DRIVER_NAME"),
        ("--node-name", "NODE_NAME"),
    ):
        load.add_argument(flag, default=os.environ.get(env, ""), help=f"[env {env}]")


def _load_target(args: argparse.Namespace, workdir: Path) -> LoadTarget:
    endpoints = read_endpoints(workdir)
    if endpoints is not None:
        return LoadTarget.from_endpoints(endpoints)
    given = (
        args.kubeconfig,
        args.nats_url,
        args.plugin_registry_dir,
        args.driver_name,
        args.node_name,
    )
    if not all(given):
        raise NoStackError(
            workdir,
            alternative=", or give --kubeconfig, --nats-url, --plugin-registry-dir, "
            "--driver-name and --node-name",
        )
    return LoadTarget(
        kubeconfig=args.kubeconfig,
        nats_url=args.nats_url,
        plugin_registry_dir=Path(args.plugin_registry_dir),
        driver=args.driver_name,
        node=args.node_name,
    )


async def _until_signal(run: Callable[[asyncio.Event], Coroutine[Any, Any, int]]) -> int:
    """Run `run(stop)`, setting `stop` on SIGINT, SIGTERM or SIGHUP; a second one is ignored,
    so that the ordered stop it started always finishes (it has its own deadlines)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in _STOP_SIGNALS:
        loop.add_signal_handler(sig, stop.set)
    try:
        return await run(stop)
    finally:
        for sig in _STOP_SIGNALS:
            loop.remove_signal_handler(sig)


async def _demo(config: StackConfig, stop: asyncio.Event) -> int:
    """The walk, cancelled by a stop signal (the stack still stops in order)."""
    walk = asyncio.create_task(run_demo(config))
    stopped = asyncio.create_task(stop.wait())
    await asyncio.wait({walk, stopped}, return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    if walk.done():
        return walk.result()
    walk.cancel()
    try:
        await walk
    except asyncio.CancelledError:
        print("\ninterrupted; everything stopped", flush=True)
    return _INTERRUPTED


def _run(args: argparse.Namespace, workdir: Path) -> int:
    """The chosen command, in its own event loop; its exit code."""
    if args.command == "claim":
        request = ClaimRequest(
            workdir=workdir,
            name=args.name,
            namespace=args.namespace,
            count=args.count,
            release=args.release,
        )
        return asyncio.run(run_claim(request, out=sys.stdout))
    if args.command == "load":
        target = _load_target(args, workdir)
        plan = LoadPlan(
            interval_s=args.interval_s, rounds=args.rounds, fault_every=args.fault_every
        )
        return asyncio.run(
            _until_signal(lambda stop: run_load(target, plan, stop=stop, out=sys.stdout))
        )
    config = StackConfig(
        workdir=workdir,
        node_name=args.node_name,
        sim_profile=args.sim_profile,
        kubernetes_version=args.kubernetes_version,
        control_plane=args.control_plane,
        nats_cluster=args.nats_cluster,
    )
    if args.control_plane == "emulator" and args.kubernetes_version not in EMULATED_VERSIONS:
        print(
            f"devcluster: the API emulator serves {', '.join(EMULATED_VERSIONS)}; "
            f"use --control-plane real for {args.kubernetes_version}",
            file=sys.stderr,
        )
        return 2
    # Before anything starts: what is missing is one line that says how to get it.
    if args.control_plane == "real":
        cached_binaries(release(args.kubernetes_version))
    else:
        extra.require(*extra.EMULATOR_SCHEMAS)
    find_binary()
    if args.command == "up":
        return asyncio.run(_until_signal(lambda stop: run_up(config, stop=stop, out=sys.stdout)))
    return asyncio.run(_until_signal(lambda stop: _demo(config, stop)))


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help")):
        argv = ["demo", *argv]  # `devcluster` alone is the demo
    args = _parser().parse_args(argv)
    # This process prints the walk; its own library logs stay quiet unless something is wrong.
    configure_logging(LogSettings(level="warning", format="console"), service="devcluster")
    workdir = (args.workdir or _WORKDIRS[args.command]).resolve()
    try:
        code = _run(args, workdir)
    except (
        WorkdirBusyError,
        OrphanedProcessesError,
        NoStackError,
        ClaimHelperError,
        DraSuiteError,
        ControlPlaneNotBuiltError,
        ControlPlaneStartError,
        NATSServerError,
    ) as exc:
        print(f"devcluster: {exc}", file=sys.stderr)
        code = 1
    sys.exit(code)
