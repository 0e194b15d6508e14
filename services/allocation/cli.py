"""Command line of the allocation agent: flags and env twins -> AllocationConfig -> run_agent.

The only module of the agent that reads `sys.argv` and `os.environ`. A bad configuration exits 2
before any socket or connection opens.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import socket
import sys
from collections.abc import Mapping, Sequence

from services.allocation.config import AllocationConfig
from services.allocation.deviceplugin.agent import DevicePluginAgent
from services.allocation.dra.agent import AllocationAgent
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
from shared.supervisor import Agent, run_process

__all__ = ["CRASH_AT_ENV", "build_config", "main"]

SERVICE = "dra-allocation"
CRASH_AT_ENV = "DRA_SUITE_CRASH_AT"
"""Fault-injection seam (tests only): exit with 137 at this prepare/unprepare step."""
# Below the DaemonSet's terminationGracePeriodSeconds (30 s).
_GRACE_S = 10.0
_GROUPS = {
    "nats": NATSSettings,
    "kube": KubeSettings,
    "log": LogSettings,
    "telemetry": TelemetrySettings,
    "ops": OpsSettings,
}


def build_config(argv: Sequence[str], env: Mapping[str, str]) -> AllocationConfig:
    parser = argparse.ArgumentParser(
        prog=SERVICE, description="dra-suite kubelet plugin: registration, DRA and health stream."
    )
    add_version(parser)
    for cls in (*_GROUPS.values(), AllocationConfig):
        add_arguments(parser, cls)
    args = parser.parse_args(list(argv))
    if args.node_name is None and env_name("--node-name") not in env:
        # Kubernetes names a node after its lower-cased hostname by default.
        args.node_name = socket.gethostname().lower()
    groups: dict[str, object] = {name: from_args(cls, args, env) for name, cls in _GROUPS.items()}
    config = from_args(AllocationConfig, args, env, **groups)
    if env.get(CRASH_AT_ENV):
        # The kill -9 tests' seam: no flag on purpose, nobody sets this by accident in a DaemonSet.
        config = dataclasses.replace(config, crash_at=env[CRASH_AT_ENV])
    return config


def main(argv: Sequence[str] | None = None) -> None:
    try:
        config = build_config(sys.argv[1:] if argv is None else argv, os.environ)
    except ConfigError as exc:
        print(f"{SERVICE}: {exc}", file=sys.stderr)
        sys.exit(2)
    logging.configure(config.log, service=SERVICE)
    node, driver = config.node_name, config.driver_name
    telemetry.configure(
        config.telemetry, service=SERVICE, node=node, driver=driver, environ=os.environ
    )
    metrics.configure(service=SERVICE, node=node, driver=driver, environ=os.environ)
    agent: Agent = (
        DevicePluginAgent(config)
        if config.kubelet_api == "device-plugin"
        else AllocationAgent(config)
    )
    code = asyncio.run(run_process(agent, grace_s=_GRACE_S))
    telemetry.shutdown()
    sys.exit(code)
