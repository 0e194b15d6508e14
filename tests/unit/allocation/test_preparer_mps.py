"""ClaimPreparer with MPS: a claim sharing a GPU gets its own control daemon (the fake
`nvidia-cuda-mps-control`) with its own limits, its directories in its CDI spec; unprepare
stops it; a restarted preparer adopts a daemon left running, starts one that died, and stops
one that no record names."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from services.allocation.cdi import spec_files
from services.allocation.cdi.spec_files import CDIWriter
from services.allocation.claim.checkpoint import CheckpointStore, ClaimState, PreparedMps
from services.allocation.claim.claims import ClaimReader, ClaimRef
from services.allocation.dra.preparer import ClaimPreparer
from services.allocation.mps import layout
from services.allocation.mps.daemons import MpsDaemons
from shared.errors import ClaimError
from shared.pb.drasuite.v1 import inventory_pb2
from tests.fakes import mps_control
from tests.fakes.allocation_sources import FakeInventory
from tests.unit.allocation.test_mps_daemons import GPU, LIMITS, ask

DRIVER = "sim.dra-suite.io"
NODE = "node-a"


def _inventory() -> inventory_pb2.Inventory:
    gpus = [
        inventory_pb2.Device(
            name=f"gpu-{i}",
            kind="gpu",
            uuid=uuid_,
            capacity={"memory": "80Gi"},
            shared_capacity={"memory": "80Gi"} if i == 0 else {},
            device_nodes=[inventory_pb2.DeviceNode(path=f"/dev/nvidia{i}", host_path="/dev/null")],
            env={"NVIDIA_VISIBLE_DEVICES": str(i)},
        )
        for i, uuid_ in enumerate([GPU, "GPU-e5dae166-a6b2-51a6-94cc-3b43c98eff7d"])
    ]
    return inventory_pb2.Inventory(
        driver=DRIVER, node=NODE, pool=NODE, backend="sim", devices=gpus, generation=1
    )


def _share(memory: str) -> dict[str, Any]:
    return {
        "request": "gpu",
        "driver": DRIVER,
        "pool": NODE,
        "device": "gpu-0",
        "shareID": str(uuid.uuid4()),
        "consumedCapacity": {"memory": memory},
    }


class Node:
    def __init__(self, base: Path, kube: Any, binary: Path) -> None:
        self.base, self.kube, self.binary = base, kube, binary
        self.preparer, self.checkpoints, self.daemons = self.start()

    def start(self) -> tuple[ClaimPreparer, CheckpointStore, MpsDaemons]:
        checkpoints = CheckpointStore(self.base / "checkpoint")
        checkpoints.load()
        (self.base / "cdi").mkdir(exist_ok=True)
        daemons = MpsDaemons(self.base / "mps", binary=str(self.binary), timeout_s=5)
        preparer = ClaimPreparer(
            claims=ClaimReader(self.kube, driver=DRIVER, pool=NODE),
            inventory=FakeInventory(_inventory()),
            checkpoints=checkpoints,
            cdi_writer=CDIWriter(self.base / "cdi", driver=DRIVER),
            driver=DRIVER,
            backend="sim",
            mps=daemons,
        )
        return preparer, checkpoints, daemons

    def restart(self) -> None:
        self.preparer, self.checkpoints, self.daemons = self.start()

    def spec(self, uid: str) -> dict[str, Any]:
        path = self.base / "cdi" / spec_files.spec_file_name(DRIVER, uid)
        return json.loads(path.read_text())  # type: ignore[no-any-return]

    def daemon_pids(self) -> list[int]:
        return mps_control.pids(self.base / "mps")


@pytest.fixture
def node(short_tmp: Path, kube_reader: Any) -> Iterator[Node]:
    binary = mps_control.install(short_tmp / "bin")
    yield Node(short_tmp / "node", kube_reader, binary)
    mps_control.kill_all(short_tmp)


def _claim(node: Node, make_claim: Any, name: str, *memory: str) -> ClaimRef:
    uid = str(uuid.uuid4())
    results = [_share(m) for m in memory]
    node.kube.put(make_claim(uid=uid, name=name, devices=[], request="gpu", extra_results=results))
    return ClaimRef(namespace="default", name=name, uid=uid)


async def test_each_claim_sharing_a_gpu_gets_its_own_daemon_with_its_own_limits(node, make_claim):
    small = _claim(node, make_claim, "small", "20Gi")
    large = _claim(node, make_claim, "large", "40Gi")
    await node.preparer.prepare(small)
    await node.preparer.prepare(large)

    assert len(node.daemon_pids()) == 2
    assert ask(node.daemons, small.uid, LIMITS) == "25.0\n20480M"
    assert ask(node.daemons, large.uid, LIMITS) == "50.0\n40960M"
    record = node.checkpoints.get(small.uid)
    assert record.state is ClaimState.PREPARE_COMPLETED
    assert record.mps == PreparedMps(devices=(GPU,), thread_percentage=25, pinned_mib=(20480,))

    [device] = node.spec(small.uid)["devices"]
    edits = device["containerEdits"]
    pipe, log = node.daemons.directories(small.uid)
    assert f"{layout.PIPE_DIR_ENV}=/tmp/nvidia-mps" in edits["env"]
    assert f"{layout.LOG_DIR_ENV}=/var/log/nvidia-mps" in edits["env"]
    assert [(m["hostPath"], m["containerPath"]) for m in edits["mounts"]] == [
        (str(pipe), "/tmp/nvidia-mps"),
        (str(log), "/var/log/nvidia-mps"),
    ]


async def test_a_repeated_prepare_keeps_the_one_daemon(node, make_claim):
    ref = _claim(node, make_claim, "a", "20Gi")
    await node.preparer.prepare(ref)
    pids = node.daemon_pids()
    await node.preparer.prepare(ref)
    assert node.daemon_pids() == pids


async def test_unprepare_stops_the_daemon_and_removes_its_directories(node, make_claim):
    ref = _claim(node, make_claim, "a", "20Gi")
    await node.preparer.prepare(ref)
    await node.preparer.unprepare(ref)
    assert node.daemon_pids() == []
    assert node.daemons.claim_uids() == []
    assert node.checkpoints.get(ref.uid) is None


async def test_a_whole_gpu_gets_no_daemon(node, make_claim):
    uid = str(uuid.uuid4())
    node.kube.put(make_claim(uid=uid, name="whole", devices=["gpu-1"], request="gpu"))
    await node.preparer.prepare(ClaimRef(namespace="default", name="whole", uid=uid))
    assert node.daemon_pids() == []
    assert node.checkpoints.get(uid).mps is None


async def test_a_restart_adopts_a_running_daemon_and_restarts_a_dead_one(node, make_claim):
    kept = _claim(node, make_claim, "kept", "20Gi")
    await node.preparer.prepare(kept)
    [pid] = node.daemon_pids()

    node.restart()
    await node.preparer.recover()
    assert node.daemon_pids() == [pid]  # adopted, not duplicated
    assert ask(node.daemons, kept.uid, LIMITS) == "25.0\n20480M"

    mps_control.kill_all(node.base)  # the agent's container restarted: its children died
    node.restart()
    await node.preparer.recover()
    [restarted] = node.daemon_pids()
    assert restarted != pid
    assert ask(node.daemons, kept.uid, LIMITS) == "25.0\n20480M"


async def test_recovery_stops_a_daemon_no_record_names(node, make_claim):
    ref = _claim(node, make_claim, "a", "20Gi")
    await node.preparer.prepare(ref)
    (node.base / "checkpoint" / f"{ref.uid}.json").unlink()
    node.restart()
    await node.preparer.recover()
    assert node.daemon_pids() == []
    assert node.daemons.claim_uids() == []


async def test_a_daemon_that_cannot_start_fails_the_claim_and_the_retry_starts_it(node, make_claim):
    (node.binary.parent / "failures").write_text("start")
    ref = _claim(node, make_claim, "a", "20Gi")
    with pytest.raises(ClaimError, match="MPS control daemon: start failed"):
        await node.preparer.prepare(ref)
    assert node.checkpoints.get(ref.uid).state is ClaimState.PREPARE_STARTED
    (node.binary.parent / "failures").write_text("")
    await node.preparer.prepare(ref)
    assert len(node.daemon_pids()) == 1
    assert node.checkpoints.get(ref.uid).state is ClaimState.PREPARE_COMPLETED
