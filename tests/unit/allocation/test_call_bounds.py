"""What one kubelet call may cost: claims in flight, memory held per claim, size of the answer,
length of names in errors and logs, and time past the call's deadline."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import subprocess
import sys
import tracemalloc
import uuid
from pathlib import Path
from typing import Any

import pytest
import structlog

from services.allocation.cdi.spec_files import CDIWriter
from services.allocation.claim import echo
from services.allocation.claim.checkpoint import CheckpointStore
from services.allocation.claim.claims import ClaimReader, ClaimRef
from services.allocation.dra import batch
from services.allocation.dra.preparer import ClaimPreparer
from shared.errors import ClaimError, KubeNotFoundError, KubeTransientError
from shared.kube.resources import ResourceType
from shared.pb.kubelet.dra.v1 import api_pb2 as v1
from tests.fakes.allocation_sources import FakeInventory

DRIVER = "sim.dra-suite.io"
NODE = "node-a"


class CountingReader:
    """A KubeReader whose claims never exist; it counts GETs in flight at once."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.most_in_flight = 0

    async def get(self, rt: ResourceType, name: str, *, namespace: str | None = None) -> Any:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0)
            raise KubeNotFoundError(f"get {rt.plural}/{name}: 404 NotFound", status=404)
        finally:
            self.in_flight -= 1


class ThrottledReader:
    """A KubeReader that answers every GET with 429 and `Retry-After: 120`."""

    def __init__(self) -> None:
        self.gets = 0

    async def get(self, rt: ResourceType, name: str, *, namespace: str | None = None) -> Any:
        self.gets += 1
        raise KubeTransientError(f"get {rt.plural}/{name}: 429", status=429, retry_after_s=120.0)


def _preparer(tmp_path, kube: Any, make_inventory) -> ClaimPreparer:
    checkpoints = CheckpointStore(tmp_path / "checkpoint")
    checkpoints.load()
    return ClaimPreparer(
        claims=ClaimReader(kube, driver=DRIVER, pool=NODE),
        inventory=FakeInventory(make_inventory("npu-0")),
        checkpoints=checkpoints,
        cdi_writer=CDIWriter(tmp_path / "cdi", driver=DRIVER),
        driver=DRIVER,
        backend="sim",
    )


def _refs(count: int) -> list[ClaimRef]:
    return [ClaimRef("default", f"claim-{i}", str(uuid.uuid4())) for i in range(count)]


async def test_a_huge_call_keeps_a_bounded_number_of_claims_in_flight(tmp_path, make_inventory):
    kube = CountingReader()
    outcomes = await _preparer(tmp_path, kube, make_inventory).prepare_batch(_refs(2000))
    assert len(outcomes) == 2000
    assert all(isinstance(o, ClaimError) for o in outcomes.values())
    assert kube.most_in_flight == batch.MAX_IN_FLIGHT


# Where log lines are made and kept: whatever earlier tests configured logging to (a capture
# buffer, pytest's record list) is not what a claim costs the agent.
_LOG_MACHINERY = [
    tracemalloc.Filter(False, "*/structlog/*"),
    tracemalloc.Filter(False, "*/logging/*"),
    tracemalloc.Filter(False, "*/_pytest/*"),
    tracemalloc.Filter(False, tracemalloc.__file__),
]


def test_memory_held_per_failed_claim_stays_small():
    """Measured in a fresh interpreter: loggers that earlier tests of a session bound to their
    capture buffers, and whatever else they left behind, are not what a claim costs."""
    result = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"),
            f"{__file__}::test_memory_held_per_failed_claim_measured",
        ],
        env={**os.environ, _ISOLATED: "1"},
        cwd=Path(__file__).resolve().parents[3],
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert result.returncode == 0, result.stdout[-4000:]
    assert "1 passed" in result.stdout, result.stdout[-4000:]


_ISOLATED = "DRA_SUITE_MEMORY_TEST_ISOLATED"


@pytest.mark.skipif(
    os.environ.get(_ISOLATED) != "1", reason="run by test_memory_held_per_failed_claim_stays_small"
)
async def test_memory_held_per_failed_claim_measured(tmp_path, make_inventory):
    """Failed claims keep their message, not the frames of the read that failed."""
    preparer = _preparer(tmp_path, CountingReader(), make_inventory)
    await preparer.prepare_batch(_refs(200))  # lazily made caches are not the claims' cost
    refs = _refs(3000)
    gc.collect()
    # Earlier tests may leave structlog routed to stdlib logging, where pytest's capture
    # handler keeps every record, with its exception and so its frames, until the test ends.
    logging.disable(logging.CRITICAL)
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot().filter_traces(_LOG_MACHINERY)
        outcomes = await preparer.prepare_batch(refs)
        gc.collect()
        after = tracemalloc.take_snapshot().filter_traces(_LOG_MACHINERY)
    finally:
        tracemalloc.stop()
        logging.disable(logging.NOTSET)
    held = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    assert len(outcomes) == len(refs)
    # About 900 bytes (the error and its answer); with each read's frames, over 4,500.
    assert held / len(refs) < 2048, f"{held / len(refs):.0f} bytes held per claim"


async def test_a_throttled_read_fails_its_claim_by_the_deadline(tmp_path, make_inventory):
    kube = ThrottledReader()
    preparer = _preparer(tmp_path, kube, make_inventory)
    loop = asyncio.get_running_loop()
    started = loop.time()
    (ref,) = _refs(1)
    outcomes = await preparer.prepare_batch([ref], deadline=started + 0.5)
    assert loop.time() - started < 0.5
    assert "429" in str(outcomes[ref.uid])
    assert kube.gets == 1


async def test_claims_not_started_by_the_deadline_get_their_own_error(tmp_path, make_inventory):
    preparer = _preparer(tmp_path, CountingReader(), make_inventory)
    refs = _refs(3)
    outcomes = await preparer.prepare_batch(refs, deadline=asyncio.get_running_loop().time())
    assert all("not started within the call's time budget" in str(o) for o in outcomes.values())


async def test_a_huge_name_is_clipped_in_the_error_and_in_every_log_line(tmp_path, make_inventory):
    preparer = _preparer(tmp_path, CountingReader(), make_inventory)
    huge = ClaimRef("default", "x" * 2**21, str(uuid.uuid4()))
    bad_uid = ClaimRef("default", "claim-a", "y" * 2**21)
    with structlog.testing.capture_logs() as logs:
        outcomes = await preparer.prepare_batch([huge, bad_uid])
    assert len(str(outcomes[huge.uid])) < 1024
    assert len(str(outcomes[bad_uid.uid])) < 1024
    assert logs
    assert max(len(str(value)) for line in logs for value in line.values()) < 4096


@pytest.mark.parametrize(
    ("claims", "error_chars"),
    [(3, 2**21), (40_000, 200)],
    ids=["a-few-huge-errors", "many-errors"],
)
def test_errors_are_shortened_until_the_answer_fits_the_kubelets_limit(claims, error_chars):
    response = v1.NodePrepareResourcesResponse(
        claims={
            str(uuid.uuid4()): v1.NodePrepareResourceResponse(error="e" * error_chars)
            for _ in range(claims)
        }
    )
    response.claims[str(uuid.uuid4())].devices.add(device_name="npu-0")
    echo.bound_errors(response.claims.values(), size=response.ByteSize())
    assert response.ByteSize() <= echo.KUBELET_MAX_MESSAGE_BYTES - 64 * 2**10
    errors = [a.error for a in response.claims.values() if not a.devices]
    assert all(error.startswith("e") for error in errors)
    assert all(len(error) <= echo.MAX_ERROR_CHARS for error in errors)


def test_clip_keeps_short_text_and_says_how_long_long_text_was():
    assert echo.clip("claim-a") == "claim-a"
    assert echo.clip("x" * 300, 10) == "xxxxxxxxxx...(300 chars)"
