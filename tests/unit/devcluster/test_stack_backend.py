"""The local stack gives its allocation agent the node's backend as a flag, as the DaemonSet
does, and the agent parses it: the backend never comes from the inventory on the bus."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from devcluster.natsserver import NATSServerProcess
from devcluster.stack import BACKEND, LocalStack, StackConfig
from services.allocation import cli as allocation_cli
from services.discovery import cli as discovery_cli


def test_the_allocation_and_discovery_agents_get_the_same_backend_flag():
    # Short: the allocation agent's socket paths under it must fit in 107 bytes.
    workdir = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))
    try:
        stack = LocalStack(StackConfig(workdir=workdir), nats=NATSServerProcess(workdir, port=1))
        argvs = {agent: stack.agent_argv(agent)[3:] for agent in ("allocation", "discovery")}
        for argv in argvs.values():
            assert argv[argv.index("--backend") + 1] == BACKEND == "sim"
        assert allocation_cli.build_config(argvs["allocation"], {}).backend == BACKEND
        assert discovery_cli.parse_config(argvs["discovery"], {}).backend == BACKEND
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
