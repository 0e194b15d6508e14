"""`dractl_fleet_*`: `dractl health --all-nodes` over a whole fleet's signed records, alone.

`make scale` measures the same command on a machine it shares with the simulated fleet, so its
wall time there is mostly the fleet's. This puts what such a fleet leaves in the buckets (per
node an inventory of 8 devices and 8 health records, each signed by the node's own certified
writer, met in no order of node) into a local nats-server and runs dractl as an operator does,
with signature checks on, `--runs` times: its wall time and its own CPU, on this machine with
nothing else running. Run alone: `python -m bench.dractl_fleet --nodes 5000`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import nats
import nkeys  # type: ignore[import-untyped]  # ships no type hints
from nats.js.api import KeyValueConfig

from bench import results_file
from bench.stats import percentile
from devcluster.certify import certified_writer
from devcluster.natsserver import NATSServerProcess
from services.natsauth.keys import SigningKey, new_signing_seed
from shared.bus import codec
from shared.bus.subjects import Names
from shared.pb.drasuite.v1 import health_pb2, inventory_pb2

__all__ = ["measure_dractl_fleet"]

_DRIVER = "sim.dra-suite.io"
_DEVICES = 8
_N = Names("")


def _records(auth: SigningKey, node: str, now: float) -> list[tuple[str, bytes, dict[str, str]]]:
    """The node's inventory and health records as its agents sign them: (subject, data, headers)."""
    discovery, health = (
        certified_writer(auth, role=role, node=node, now=now, lifetime_s=21600)
        for role in ("discovery", "health")
    )
    inventory = inventory_pb2.Inventory(driver=_DRIVER, node=node, pool=node, generation=1)
    for index in range(_DEVICES):
        inventory.devices.add(name=f"gpu-{index}", kind="gpu")
    subject = _N.kv_subject(_N.inventory_bucket, _N.inventory_key(_DRIVER, node))
    data = codec.encode(inventory)
    found = [(subject, data, discovery.headers(subject, data, {}))]
    for index in range(_DEVICES):
        device = f"gpu-{index}"
        record = health_pb2.DeviceHealth(
            driver=_DRIVER, node=node, pool=node, device=device,
            state=health_pb2.HEALTH_STATE_HEALTHY, since_unix_ms=int(now * 1000),
            updated_unix_ms=int(now * 1000),
        )  # fmt: skip
        subject = _N.kv_subject(_N.health_bucket, _N.health_key(_DRIVER, node, device))
        data = codec.encode(record)
        found.append((subject, data, health.headers(subject, data, {})))
    return found


async def _populate(url: str, auth: SigningKey, nodes: int) -> None:
    now = time.time()
    records = [r for i in range(nodes) for r in _records(auth, f"node-{i:05d}", now)]
    # Health records are refreshed at jittered times: a bucket holds them in no order of node.
    random.Random(7).shuffle(records)
    client = await nats.connect(url)
    try:
        js = client.jetstream()
        for bucket in (_N.inventory_bucket, _N.health_bucket):
            await js.create_key_value(KeyValueConfig(bucket=bucket, history=1))
        for start in range(0, len(records), 512):
            batch = records[start : start + 512]
            acks = [js.publish(s, d, headers=h) for s, d, h in batch]
            await asyncio.gather(*acks)
    finally:
        await client.close()


async def _dractl(url: str, key_file: Path, nodes: int) -> tuple[float, float]:
    """One `dractl -o json health --all-nodes`: (wall s, CPU s)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "services.dractl", f"--nats-url={url}",
        f"--driver-name={_DRIVER}", "--bus-signatures=enforce",
        f"--bus-auth-key-file={key_file}", "-o", "json", "health", "--all-nodes",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await process.communicate()
    elapsed = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    counts = json.loads(out)["counts"] if process.returncode == 0 else {}
    if counts.get("nodes") != nodes or err:
        raise RuntimeError(f"dractl health --all-nodes: {counts} {err.decode()[-500:]}")
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return elapsed, cpu


async def measure_dractl_fleet(*, nodes: int, runs: int) -> dict[str, Any]:
    auth = SigningKey.from_seed(
        new_signing_seed(nkeys.PREFIX_BYTE_OPERATOR), nkeys.PREFIX_BYTE_OPERATOR
    )
    with tempfile.TemporaryDirectory(prefix="dra-bench-dractl-") as tmp:
        key_file = Path(tmp) / "certify.pub"
        key_file.write_text(auth.public + "\n")
        server = NATSServerProcess(Path(tmp) / "nats")
        await asyncio.to_thread(server.start)
        try:
            await _populate(server.url, auth, nodes)
            timed = [await _dractl(server.url, key_file, nodes) for _ in range(runs)]
        finally:
            await asyncio.to_thread(server.stop)
    walls, cpus = [w for w, _ in timed], [c for _, c in timed]
    return {
        "dractl_fleet_nodes": nodes,
        "dractl_fleet_records": nodes * (_DEVICES + 1),
        "dractl_fleet_health_all_s": round(percentile(walls, 50), 2),
        "dractl_fleet_health_all_cpu_s": round(percentile(cpus, 50), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="bench.dractl_fleet")
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("bench/results.json"))
    args = parser.parse_args()
    figures = asyncio.run(measure_dractl_fleet(nodes=args.nodes, runs=args.runs))
    results_file.merge(args.out, figures)
    print(json.dumps(figures, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
