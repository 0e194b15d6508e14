"""Command line of the discovery agent: flags with env twins, then the supervisor.

The only discovery module that reads argv and the environment.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
from collections.abc import Mapping

from services.discovery.agent import DiscoveryAgent
from services.discovery.config import DiscoveryConfig
from shared import logging, metrics, telemetry
from shared.config import (
    KubeSettings,
    LogSettings,
    NATSSettings,
    OpsSettings,
    TelemetrySettings,
    add_arguments,
    add_version,
    env_name,
    from_args,
)
from shared.errors import ConfigError
from shared.supervisor import run_process

__all__ = ["main", "parse_config"]

SERVICE = "dra-discovery"
_GROUPS: dict[str, type[object]] = {
    "nats": NATSSettings,
    "kube": KubeSettings,
    "log": LogSettings,
    "telemetry": TelemetrySettings,
    "ops": OpsSettings,
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=SERVICE, description="Publishes the node's devices to NATS and as ResourceSlices."
    )
    add_version(parser)
    for cls in (*_GROUPS.values(), DiscoveryConfig):
        add_arguments(parser, cls)
    return parser


def parse_config(argv: list[str], env: Mapping[str, str]) -> DiscoveryConfig:
    """Flags, then env twins, then defaults; the node name defaults to the host name."""
    args = _parser().parse_args(argv)
    if args.node_name is None and env_name("--node-name") not in env:
        args.node_name = socket.gethostname().lower()
    groups: dict[str, object] = {name: from_args(cls, args, env) for name, cls in _GROUPS.items()}
    return from_args(DiscoveryConfig, args, env, **groups)


def main(argv: list[str] | None = None) -> None:
    try:
        config = parse_config(sys.argv[1:] if argv is None else argv, os.environ)
    except ConfigError as exc:
        print(f"{SERVICE}: {exc}", file=sys.stderr)
        sys.exit(2)
    logging.configure(config.log, service=SERVICE)
    node, driver = config.node_name, config.driver_name
    telemetry.configure(
        config.telemetry, service=SERVICE, node=node, driver=driver, environ=os.environ
    )
    metrics.configure(service=SERVICE, node=node, driver=driver, environ=os.environ)
    try:
        code = asyncio.run(run_process(DiscoveryAgent(config), grace_s=10.0))
    finally:
        telemetry.shutdown()
    sys.exit(code)
