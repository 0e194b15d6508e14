"""The allocation agent SIGKILLed again and again while claims get dynamic partitions made.

Every claim asks (opaque DeviceConfig, `partition.profile`) for a partition of each of its
devices on the `mixed` sim node: MIG profiles of its GPUs, vNPU templates of its NPUs, one or
two devices a claim. First the `partition-created` step is hit exactly once through the
`DRA_SUITE_CRASH_AT` seam (the agent dies right after the first of two partitions). Then
`CYCLES` prepare/unprepare cycles run back to back, each preparing `CLAIMS_PER_CYCLE` new
claims in one call while the previous cycle's are unprepared in another; during `KILLS`
cycles drawn from a seeded RNG the allocation agent is SIGKILLed, either after a random delay
or as soon as the cycle's n-th partition shows in the sim state file (right around partition
creation), and started again at once; the kubelet retries as the real one does.

A sampler reads the state file all along. Afterwards: no (claim, device) ever had two
partitions or two partition IDs, nor a second `partition_created` log line (none made twice);
every prepared claim's checkpoint record, CDI spec and the state file agree on its partition
IDs, which a repeated prepare leaves unchanged; no partition belongs to a claim that is not
prepared (none leaked); the checkpoint and the CDI specs hold exactly the prepared claims,
nothing temporary is left, and after unpreparing everything the state file holds nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from devcluster.kubelet import KubeletClaim
from devcluster.processes import ChildProcess
from services.allocation.cdi import spec_files
from services.allocation.claim.checkpoint import CheckpointStore, ClaimState
from tests.reliability.harness import DRIVER, ReliabilityNode, partition_config, until

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(120)]

SEED = 20_260_419
CYCLES = 16
KILLS = 6
MAX_KILL_DELAY_S = 0.03
GPUS = [f"gpu-{i}" for i in range(4)]
NPUS = [f"npu-{i}" for i in range(8)]
PARTITIONS_PER_CYCLE = 6
"""1 + 2 GPU partitions and 1 + 2 NPU partitions: see `cycle_claims`."""

Obj = dict[str, Any]
Key = tuple[str, str]
"""(claim UID, device)."""


@dataclass(frozen=True)
class Wanted:
    """A claim to make: its devices and the partition profile asked for each of them."""

    devices: tuple[str, ...]
    profile: str


def cycle_claims(cycle: int) -> list[Wanted]:
    """Two GPU and two NPU claims, one and two devices each, rotating over the devices. No
    device ever needs more room than two consecutive cycles (the only ones alive at once) take:
    a GPU at most 2 x 2g.20gb of its 7 slices, an NPU at most 2 x 10 of its 20 AI cores."""
    gpu = [GPUS[(cycle + i) % len(GPUS)] for i in range(3)]
    npu = [NPUS[(2 * cycle + i) % len(NPUS)] for i in range(3)]
    return [
        Wanted((gpu[0],), "1g.10gb"),
        Wanted((gpu[1], gpu[2]), "2g.20gb"),
        Wanted((npu[0],), "vir05_1c_16g"),
        Wanted((npu[1], npu[2]), "vir10_3c_16g"),
    ]


@dataclass(frozen=True)
class Kill:
    """SIGKILL after `delay_s`, or (when `nth_partition`) once the cycle made that many."""

    delay_s: float = 0.0
    nth_partition: int = 0


def kill_plan(rng: random.Random) -> dict[int, Kill]:
    """Cycle -> kill; never the last cycle, half of them right after a partition was made."""
    cycles = sorted(rng.sample(range(CYCLES - 1), KILLS))
    return {
        cycle: (
            Kill(nth_partition=rng.randint(1, PARTITIONS_PER_CYCLE - 1))
            if rng.random() < 0.5
            else Kill(delay_s=rng.uniform(0, MAX_KILL_DELAY_S))
        )
        for cycle in cycles
    }


@dataclass
class PartitionSampler:
    """Reads the sim state file over and over: every ID seen per (claim, device), and whether
    one snapshot ever held two partitions of one (claim, device)."""

    node: ReliabilityNode
    ids: dict[Key, set[str]] = field(default_factory=dict)
    doubled: list[Key] = field(default_factory=list)
    snapshots: int = 0

    def sample(self) -> None:
        entries = self.node.sim_partitions()
        self.snapshots += 1
        counts = Counter((e["claimUID"], e["device"]) for e in entries)
        self.doubled += [key for key, n in counts.items() if n > 1]
        for entry in entries:
            self.ids.setdefault((entry["claimUID"], entry["device"]), set()).add(entry["id"])

    async def run(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(0.002)


@contextlib.asynccontextmanager
async def sampling(node: ReliabilityNode) -> AsyncIterator[PartitionSampler]:
    sampler = PartitionSampler(node)
    task = asyncio.create_task(sampler.run())
    try:
        yield sampler
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        sampler.sample()


def _expected_ids(claim: KubeletClaim, devices: Sequence[str]) -> list[list[str]]:
    return [[spec_files.device_id(DRIVER, spec_files.device_name(claim.uid, d))] for d in devices]


def _partitions_by_claim(node: ReliabilityNode) -> dict[str, dict[str, Obj]]:
    """Claim UID -> device -> its partition, asserting one partition per (claim, device)."""
    found: dict[str, dict[str, Obj]] = {}
    for entry in node.sim_partitions():
        devices = found.setdefault(entry["claimUID"], {})
        assert entry["device"] not in devices, f"two partitions for {entry}"
        devices[entry["device"]] = entry
    return found


def _log_events(node: ReliabilityNode, event: str) -> list[Obj]:
    """The allocation agent's JSON log records of `event`, across all its lives (a line cut
    off by a kill is no record)."""
    log = (node.stack.config.logs_dir / "allocation.log").read_text(errors="replace")
    found = []
    for line in log.splitlines():
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if isinstance(record, dict) and record.get("event") == event:
                found.append(record)
    return found


def _created_per_key(node: ReliabilityNode) -> Counter[Key]:
    """`partition_created` records per (claim, device)."""
    return Counter(
        (str(r.get("claim_uid")), str(r.get("device")))
        for r in _log_events(node, "partition_created")
    )


def _assert_partitions_match(
    node: ReliabilityNode, claims: Sequence[KubeletClaim], wanted: dict[str, Wanted]
) -> dict[Key, str]:
    """The state file holds exactly one partition per (prepared claim, device) of the asked
    profile and nothing else; the checkpoint record and the CDI spec name the same IDs.
    Returns (claim, device) -> partition ID."""
    by_claim = _partitions_by_claim(node)
    assert sorted(by_claim) == sorted(c.uid for c in claims), "partition of a claim not prepared"
    store = CheckpointStore(node.checkpoint_dir)
    store.load()
    ids: dict[Key, str] = {}
    for claim in claims:
        want = wanted[claim.uid]
        made = by_claim[claim.uid]
        assert sorted(made) == sorted(want.devices)
        assert {e["profile"] for e in made.values()} == {want.profile}
        record = store.get(claim.uid)
        assert record is not None
        assert record.state is ClaimState.PREPARE_COMPLETED
        assert [(p.device, p.partition_id) for p in record.partitions] == [
            (d, made[d]["id"]) for d in want.devices
        ]
        spec = json.loads(
            (node.cdi_root / spec_files.spec_file_name(DRIVER, claim.uid)).read_text()
        )
        joined = ",".join(made[d]["id"] for d in want.devices)
        for device in spec["devices"]:
            assert f"DRA_SUITE_PARTITION_ID={joined}" in device["containerEdits"]["env"]
        ids.update({(claim.uid, d): made[d]["id"] for d in want.devices})
    return ids


async def _prepare_checked(
    node: ReliabilityNode, claims: Sequence[KubeletClaim], wanted: dict[str, Wanted]
) -> None:
    answers = await node.prepare(claims, timeout_s=45)
    for claim in claims:
        assert answers[claim.uid].error == "", answers[claim.uid].error
        ids = [list(d.cdi_device_ids) for d in answers[claim.uid].devices]
        assert ids == _expected_ids(claim, wanted[claim.uid].devices)


async def _kill_and_restart(
    node: ReliabilityNode, kill: Kill, new: set[str], done: asyncio.Event
) -> str:
    """SIGKILL the allocation agent at `kill`, start it again; says where it struck."""
    if kill.nth_partition:
        # Polled every millisecond, so that the kill lands right after that partition.
        made = 0
        while made < kill.nth_partition and not done.is_set():
            await asyncio.sleep(0.001)
            made = sum(e["claimUID"] in new for e in node.sim_partitions())
        where = f"with {made}/{PARTITIONS_PER_CYCLE} partitions made"
    else:
        await asyncio.sleep(kill.delay_s)
        where = f"after {kill.delay_s * 1000:.1f} ms"
    if done.is_set():
        where += " (cycle already done)"
    code = await node.stack.kill_agent("allocation")
    # -9; 255 when asyncio's child watcher lost the race to reap it and could not tell.
    assert code in (-9, 255), f"allocation was not killed by SIGKILL (exit {code})"
    await node.stack.start_agent("allocation")
    return where


async def _crash_once_at_partition_created(
    node: ReliabilityNode, wanted: dict[str, Wanted]
) -> None:
    """The seam: the agent exits right after the first of a claim's two partitions; it is
    started again and the kubelet's retry finishes the claim with that very partition."""
    want = Wanted(("gpu-2", "gpu-3"), "1g.10gb")
    claim = await node.allocated_claim(want.devices, parameters=partition_config(want.profile))
    wanted[claim.uid] = want
    process = await node.start_allocation_crashing_at("partition-created")

    async def restart_when_dead() -> list[Obj]:
        await until(lambda: _exited(process), what="the crash at partition-created")
        made = node.sim_partitions()
        code = await node.stack.kill_agent("allocation")
        assert code in (137, 255), f"allocation exited {code}, not by the seam"
        await node.stack.start_agent("allocation")
        return made

    retried = node.retried
    made_at_crash, _ = await asyncio.gather(
        restart_when_dead(), _prepare_checked(node, [claim], wanted)
    )
    assert node.retried > retried
    crashes = [r.get("step") for r in _log_events(node, "crash_injected")]
    assert crashes == ["partition-created"], "the seam was not hit"
    [first] = made_at_crash
    assert (first["claimUID"], first["device"]) == (claim.uid, "gpu-2")
    ids = _assert_partitions_match(node, [claim], wanted)
    assert ids[(claim.uid, "gpu-2")] == first["id"], "the partition was made a second time"
    await node.unprepare([claim])
    assert node.sim_partitions() == []
    node.assert_prepared_exactly([])


async def _exited(process: ChildProcess) -> bool:
    return process.returncode is not None


async def test_sigkill_of_the_allocation_agent_while_partitions_are_made_neither_leaks_nor_doubles(
    node: ReliabilityNode,
):
    rng = random.Random(SEED)
    plan = kill_plan(rng)
    print(f"kill plan (seed {SEED}): {plan}")
    wanted: dict[str, Wanted] = {}
    first_ids: dict[Key, str] = {}
    async with sampling(node) as sampler:
        await _crash_once_at_partition_created(node, wanted)
        batches: list[list[KubeletClaim]] = []
        for cycle in range(CYCLES):
            batch = []
            for want in cycle_claims(cycle):
                claim = await node.allocated_claim(
                    want.devices, parameters=partition_config(want.profile)
                )
                wanted[claim.uid] = want
                batch.append(claim)
            batches.append(batch)

        struck: list[str] = []
        previous: list[KubeletClaim] = []
        for cycle, claims in enumerate(batches):
            done = asyncio.Event()

            async def work(
                new: list[KubeletClaim], old: list[KubeletClaim], done: asyncio.Event
            ) -> None:
                try:
                    await asyncio.gather(
                        _prepare_checked(node, new, wanted), node.unprepare(old, timeout_s=45)
                    )
                finally:
                    done.set()

            if cycle in plan:
                new = {c.uid for c in claims}
                _, where = await asyncio.gather(
                    work(claims, previous, done), _kill_and_restart(node, plan[cycle], new, done)
                )
                struck.append(f"cycle {cycle}: {where}")
            else:
                await work(claims, previous, done)
            # The claims just prepared hold exactly their partitions, with the IDs they had
            # since the partition was made; the ones just unprepared hold none.
            ids = _assert_partitions_match(node, claims, wanted)
            for key, partition_id in ids.items():
                assert first_ids.setdefault(key, partition_id) == partition_id
            previous = claims

        print("kills:", *struck, sep="\n  ")
        print(f"kubelet calls retried after a kill: {node.retried}")
        assert node.retried >= KILLS, "a kill hit no call: not under load"
        assert node.stack.exited_agents() == {}

        node.assert_prepared_exactly(previous)
        assert node.temporary_files() == []
        ids = _assert_partitions_match(node, previous, wanted)
        # A repeated prepare after all the restarts gives the same answer and makes nothing.
        before = node.sim_partitions()
        await _prepare_checked(node, previous, wanted)
        assert node.sim_partitions() == before
        assert _assert_partitions_match(node, previous, wanted) == ids

        await node.unprepare(previous)
    node.assert_prepared_exactly([])
    assert node.sim_partitions() == []
    assert node.temporary_files() == []

    made = {key for key in sampler.ids if key[0] in wanted}
    expected = {(uid, d) for uid, want in wanted.items() for d in want.devices}
    print(
        f"claims {len(wanted)}, partitions made {len(made)}, state file snapshots "
        f"{sampler.snapshots}"
    )
    assert sampler.doubled == [], f"two partitions at once for {sorted(set(sampler.doubled))}"
    assert {k: v for k, v in sampler.ids.items() if len(v) > 1} == {}, "a partition made twice"
    assert made == expected
    created = _created_per_key(node)
    assert {k: n for k, n in created.items() if n > 1} == {}, "a partition made twice"
    assert set(created) <= expected
