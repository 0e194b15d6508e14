"""`devcluster load` on a running stack: rounds of claims prepared and released through the
kubelet emulator, and faults that raise and resolve alerts, leaving nothing prepared."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import pytest

from devcluster import flow
from devcluster.load import LoadPlan, LoadTarget, run_load
from devcluster.stack import LocalStack, StackConfig
from shared.bus.session import open_bus

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


async def test_rounds_prepare_release_and_fault_then_leave_nothing_behind(short_tmp: Path):
    async with LocalStack(StackConfig(workdir=short_tmp / "stack")) as stack:
        target = LoadTarget.from_endpoints(stack.endpoints())
        out = io.StringIO()
        plan = LoadPlan(interval_s=0.2, rounds=4, fault_every=2)
        assert await run_load(target, plan, stop=asyncio.Event(), out=out) == 0, out.getvalue()

        lines = out.getvalue().splitlines()
        assert [line.split(":")[0] for line in lines if "prepared" in line] == [
            f"load-{n}" for n in range(1, 5)
        ]
        assert sum("fault injected on" in line for line in lines) == 2
        assert sum("fault cleared on" in line for line in lines) == 2
        assert not list(stack.config.cdi_root.iterdir())  # every claim was unprepared

        async with open_bus(stack.nats_settings) as bus:

            async def raised_and_resolved() -> bool:
                info = await bus.js.stream_info(bus.names.alerts_stream)
                return info.state.messages >= 2  # a RAISED, then its RESOLVED after the hold

            await flow.eventually(raised_and_resolved, what="a raised and a resolved alert")
