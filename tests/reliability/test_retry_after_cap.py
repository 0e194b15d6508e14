"""A long Retry-After on DeviceTaintRule writes holds a taint back seconds, not minutes.

The API server answers every taint rule write with 429 and `Retry-After: 300` while a device
fails. Honoured literally, the faulty device stayed untainted for minutes after the API server
recovered; the health agent caps the wait (`taints.RETRY_AFTER_CAP_S`) and keeps retrying, so
the taint lands within that cap (plus its jittered backoff) of the recovery.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from services.health import taints
from tests.reliability.emulator_control import TAINT_RULES, write_rules
from tests.reliability.harness import ReliabilityNode, until

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(120)]

FAULTY = "npu-3"
RETRY_AFTER_S = 300


async def test_a_taint_lands_within_the_cap_after_a_long_retry_after(node: ReliabilityNode):
    started = time.time()
    await node.api.add_faults(write_rules(TAINT_RULES, status=429, retry_after_s=RETRY_AFTER_S))
    await node.inject(FAULTY)

    async def refused_write() -> bool | None:
        return bool(await node.api.writes(TAINT_RULES, since=started)) or None

    await until(refused_write, what="a refused taint rule write", timeout_s=20)
    await asyncio.sleep(1.0)
    await node.api.clear_faults()
    recovered = time.monotonic()

    async def tainted() -> bool | None:
        return await node.tainted_devices() == [FAULTY] or None

    await until(tainted, what=f"a taint on {FAULTY}", timeout_s=taints.RETRY_AFTER_CAP_S + 10)
    print(f"tainted {time.monotonic() - recovered:.1f}s after the API server recovered")
    assert time.monotonic() - recovered < taints.RETRY_AFTER_CAP_S + 5
