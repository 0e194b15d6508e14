"""The checkpoint directory cannot be written: a clear per-claim error, nothing half-written,
and the kubelet's retry succeeds once the fault is gone.

Two faults: the disk is full (the checkpoint directory is a small tmpfs filled to the brim;
needs mount privileges, skipped without them) and the directory is unusable (replaced by a
regular file, so every write fails with ENOTDIR; permissions cannot be used, the tests run as
root). A claim prepared before the fault keeps its answer; a new claim gets an error that names
the claim, the checkpoint and the OS error, and leaves no CDI spec, record or temporary file.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from services.allocation import cdi
from services.devcluster.kubelet import KubeletClaim
from shared.pb.kubelet.dra.v1 import api_pb2 as dra
from tests.reliability.harness import DRIVER, ReliabilityNode

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(120)]

TMPFS_SIZE = "256k"


class DiskFull:
    """The checkpoint directory on a small tmpfs (mounted while still empty), then filled."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.filler = directory / "filler"
        self.os_error = os.strerror(errno.ENOSPC)

    def setup(self) -> None:
        mount = ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE},mode=0700", "tmpfs"]
        if (
            shutil.which("mount") is None
            or subprocess.run(
                [*mount, str(self.directory)], capture_output=True, check=False
            ).returncode
        ):
            pytest.skip("mounting a tmpfs needs mount privileges (CAP_SYS_ADMIN)")

    def apply(self) -> None:
        # Unbuffered, so that the ENOSPC comes from a write and not from close().
        with self.filler.open("wb", buffering=0) as out, contextlib.suppress(OSError):
            while True:
                out.write(b"\0" * 4096)
        assert shutil.disk_usage(self.directory).free < 4096

    def stored(self) -> list[str]:
        """What the checkpoint directory holds, less the filler."""
        return sorted(p.name for p in self.directory.iterdir() if p != self.filler)

    def remove(self) -> None:
        self.filler.unlink()

    def teardown(self) -> None:
        subprocess.run(["umount", "-l", str(self.directory)], check=False)


class NotADirectory:
    """The checkpoint directory moved aside and a regular file put in its place."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.saved = directory.with_name(directory.name + ".saved")
        self.os_error = os.strerror(errno.ENOTDIR)

    def setup(self) -> None:
        pass

    def apply(self) -> None:
        self.directory.rename(self.saved)
        self.directory.write_text("not a directory\n")

    def stored(self) -> list[str]:
        return sorted(p.name for p in self.saved.iterdir())

    def remove(self) -> None:
        self.directory.unlink()
        self.saved.rename(self.directory)

    def teardown(self) -> None:
        if self.saved.exists():
            self.remove()


FAULTS = {"disk full": DiskFull, "checkpoint dir not a directory": NotADirectory}


def _cdi_ids(answer: dra.NodePrepareResourceResponse) -> list[list[str]]:
    return [list(d.cdi_device_ids) for d in answer.devices]


def _want_ids(claim: KubeletClaim, device: str) -> list[list[str]]:
    return [[cdi.device_id(DRIVER, cdi.device_name(claim.uid, device))]]


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
        # The claim prepared before keeps its answer; the new one fails, and says why.
        assert _cdi_ids(answers[before.uid]) == _want_ids(before, "npu-0")
        error = answers[new.uid].error
        print(f"per-claim error: {error}")
        assert new.uid in error
        assert "checkpoint" in error
        assert fault.os_error in error
        # Nothing half-written: no spec, record or temporary file of the failed claim.
        assert node.cdi_files() == [cdi.spec_file_name(DRIVER, before.uid)]
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
