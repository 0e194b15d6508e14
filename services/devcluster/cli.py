"""`dra-suite`: run the suite on one machine with the embedded defaults (sim, local NATS).

`dra-suite demo` walks the spine's flow and exits 0 when every step checked out;
`dra-suite up` runs the stack until Ctrl-C and prints how to reach it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from pathlib import Path

from services.devcluster.demo import run_demo
from services.devcluster.stack import LocalStack, StackConfig
from shared.config import LogSettings
from shared.logging import configure as configure_logging

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dra-suite", description=__doc__)
    parser.add_argument("command", choices=("demo", "up"), nargs="?", default="demo")
    parser.add_argument("--workdir", type=Path, default=Path(".demo"))
    parser.add_argument("--node-name", default="demo-node")
    parser.add_argument("--sim-profile", default="mixed")
    parser.add_argument("--kubernetes-version", default="1.36", choices=("1.34", "1.35", "1.36"))
    return parser


async def _up(config: StackConfig) -> int:
    async with LocalStack(config) as stack:
        assert stack.nats is not None
        print(f"nats-server   {stack.nats.url}")
        print(f"kubeconfig    {config.kubeconfig}")
        print(f"kubelet dirs  {config.registry_dir.parent}")
        print(f"logs          {config.logs_dir}")
        print(f"try: dractl --nats-url {stack.nats.url} --node-name {config.node_name} inventory")
        print("Ctrl-C stops everything", flush=True)
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.Event().wait()
    return 0


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    # This process prints the walk; its own library logs stay quiet unless something is wrong.
    configure_logging(LogSettings(level="warning", format="console"), service="dra-suite")
    config = StackConfig(
        workdir=args.workdir.resolve(),
        node_name=args.node_name,
        sim_profile=args.sim_profile,
        kubernetes_version=args.kubernetes_version,
    )
    runner = run_demo(config) if args.command == "demo" else _up(config)
    try:
        sys.exit(asyncio.run(runner))
    except KeyboardInterrupt:
        sys.exit(0)
