"""The allocation agent as a process on an nvml node whose NVML is a fake (tests only).

`python -m tests.integration.allocation.nvml_mig_agent <the agent's flags>` runs the agent as
`python -m services.allocation` does (same flags and env twins, `DRA_SUITE_CRASH_AT`
included), with one difference: its MIG partition manager drives `tests/fakes/nvml_mig.py`
instead of the real NVML. The fake keeps its GPU instances in the JSON file `FAKE_NVML_STATE`
names and writes its capability files under `FAKE_NVML_CAPABILITIES`, so a kill -9 leaves
behind what was made, as the hardware would, and the restarted process finds it.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from services.allocation import cli
from services.allocation.dra.agent import AllocationAgent
from services.allocation.partitions.by_backend import CompositePartitionManager
from shared import logging
from shared.supervisor import run_process
from shared.vendors import nvidia
from shared.vendors.nvidia.partitions import MigPartitionManager
from tests.fakes.nvml_mig import FakeMigNVML

__all__ = ["CAPABILITIES_ENV", "COUNT", "MODEL", "STATE_ENV", "main"]

STATE_ENV = "FAKE_NVML_STATE"
CAPABILITIES_ENV = "FAKE_NVML_CAPABILITIES"
MODEL = "H100-80GB"
COUNT = 2


def main() -> None:
    config = cli.build_config(sys.argv[1:], os.environ)
    logging.configure(config.log, service="dra-allocation")
    caps = Path(os.environ[CAPABILITIES_ENV])
    nvml = FakeMigNVML(
        MODEL, count=COUNT, capabilities_root=caps, state=Path(os.environ[STATE_ENV])
    )
    agent = AllocationAgent(config)
    manager = MigPartitionManager(
        config.data_dir / nvidia.STATE_FILE, open_library=lambda: nvml, capabilities_root=caps
    )
    agent.partitions = CompositePartitionManager([manager], backend=lambda: config.backend)
    sys.exit(asyncio.run(run_process(agent, grace_s=10.0)))


if __name__ == "__main__":
    main()
