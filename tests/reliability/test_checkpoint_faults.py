"""The checkpoint directory cannot be written: a clear per-claim error, nothing half-written,
and the kubelet's retry succeeds once the fault is gone.

Two faults: the disk is full (the checkpoint directory is a small tmpfs filled to the brim;
needs mount privileges, skipped without them) and the directory is unusable (replaced by a
regular file, so every write fails with ENOTDIR; permissions cannot be used, the tests run as
root). A claim prepared before the fault keeps its answer while its record can still be read (a
repeat is never answered from memory alone); a new claim gets an error that names the claim,
the checkpoint and the OS error, and leaves no CDI spec, record or temporary file.
"""

from __future__ import annotations

import pytest

from devcluster.kubelet import KubeletClaim
from services.allocation.cdi import spec_files
from shared.pb.kubelet.dra.v1 import api_pb2 as dra
from tests.reliability.disk_faults import DiskFull, NotADirectory
from tests.reliability.harness import DRIVER, ReliabilityNode

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(120)]

FAULTS = {"disk full": DiskFull, "checkpoint dir not a directory": NotADirectory}


def _cdi_ids(answer: dra.NodePrepareResourceResponse) -> list[list[str]]:
    return [list(d.cdi_device_ids) for d in answer.devices]


def _want_ids(claim: KubeletClaim, device: str) -> list[list[str]]:
    return [[spec_files.device_id(DRIVER, spec_files.device_name(claim.uid, device))]]


@pytest.mark.parametrize("fault_type", FAULTS.values(), ids=FAULTS.keys())
async def test_an_unwritable_checkpoint_fails_the_claim_cleanly_and_recovers(
    node: ReliabilityNode, fault_type: type[DiskFull | NotADirectory]
):
    fault = fault_type(node.checkpoint_dir)
    fault.setup()
    try:
        before = await node.allocated_claim(["npu-0"])
        assert _cdi_ids((await node.prepare([before]))[before.uid]) == _want_ids(before, "npu-0")
        fault.apply()
        new = await node.allocated_claim(["npu-1"])
        answers = await node.prepare([before, new])
        if fault.records_kept:
            # The claim prepared before keeps its answer; the new one fails, and says why.
            assert _cdi_ids(answers[before.uid]) == _want_ids(before, "npu-0")
        else:
            # Its record is gone from where it was, and cannot be written again: a repeat is
            # never answered from memory alone.
            assert fault.os_error in answers[before.uid].error
        error = answers[new.uid].error
        print(f"per-claim error: {error}")
        assert new.uid in error
        assert "checkpoint" in error
        assert fault.os_error in error
        # Nothing half-written: no spec, record or temporary file of the failed claim.
        assert node.cdi_files() == [spec_files.spec_file_name(DRIVER, before.uid)]
        assert fault.stored() == [f"{before.uid}.json"]

        fault.remove()
        answer = (await node.prepare([new]))[new.uid]
        assert answer.error == ""
        assert _cdi_ids(answer) == _want_ids(new, "npu-1")
        node.assert_prepared_exactly([before, new])
        unprepared = await node.unprepare([before, new])
        assert [a.error for a in unprepared.values()] == ["", ""]
        node.assert_prepared_exactly([])
    finally:
        fault.teardown()
