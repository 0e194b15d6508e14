"""`dra-health`: flags and env into a HealthConfig, logging and tracing, then the agent.

The only module of the agent that reads `sys.argv` and `os.environ`.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import socket
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from services.health.agent import HealthAgent
from services.health.config import HealthConfig
from shared import logging, metrics, telemetry
from shared.config import (
    KubeSettings,
    LogSettings,
    NATSSettings,
    OpsSettings,
    TelemetrySettings,
    add_arguments,
    add_version,
    from_args,
)
from shared.errors import ConfigError
from shared.supervisor import run_process

__all__ = ["GRACE_S", "main", "parse"]

SERVICE = "dra-health"
# Below the pod's terminationGracePeriodSeconds (30 s by default).
GRACE_S = 10.0
_GROUPS = {
    "nats": NATSSettings,
    "kube": KubeSettings,
    "log": LogSettings,
    "telemetry": TelemetrySettings,
    "ops": OpsSettings,
}


def parse(argv: Sequence[str] | None, env: Mapping[str, str]) -> HealthConfig:
    """The config from flags, then env twins, then defaults; raises ConfigError."""
    parser = argparse.ArgumentParser(
        prog=SERVICE, description="dra-suite health agent: device health, taints and alerts."
    )
    add_version(parser)
    for cls in (*_GROUPS.values(), HealthConfig):
        add_arguments(parser, cls)
    args = parser.parse_args(argv)
    groups: dict[str, Any] = {name: from_args(cls, args, env) for name, cls in _GROUPS.items()}
    config = from_args(HealthConfig, args, env, **groups)
    if not config.node_name:
        config = dataclasses.replace(config, node_name=socket.gethostname().lower())
    return config


def main(argv: Sequence[str] | None = None) -> None:
    try:
        config = parse(argv, os.environ)
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
        agent = HealthAgent(config)  # reads --policy-file: its errors are config errors too
    except ConfigError as exc:
        telemetry.shutdown()
        print(f"{SERVICE}: {exc}", file=sys.stderr)
        sys.exit(2)
    code = asyncio.run(run_process(agent, grace_s=GRACE_S))
    telemetry.shutdown()
    sys.exit(code)
