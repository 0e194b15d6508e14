"""How fast a node over its bucket quota is cut off, and what the quota auditor costs.

On the secured bus (nats-server with the auth callout, `dra-nats-auth` in process, as in
`tests/integration/security`), node A's health identity (then its allocation identity, in
the claims bucket) puts new keys of the bucket's largest value as fast as it can, without
waiting for acks, while node B puts a new key every 20 ms. Per trial: from A's first key over
its quota to A's connection ended (`bus_quota_enforce_p99_ms`: detection, revocation and the
kick), the keys A got in, and B's refused puts (0 wanted). Between trials the operator
unrevokes A. The auditor's memory: its ledger for 1,000 nodes (a typical node: 1 inventory,
16 device records, 8 prepared claims; and a node at its full quota), by `tracemalloc`.

`python -m bench.bus_quota` (merges its figures into bench/results.json).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import tracemalloc
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.stats import percentile
from devcluster.apiserver import APIServerEmulator, ClusterConfig
from services.natsauth import quota
from services.natsauth.quotaledger import QuotaLedger
from services.natsauth.revocationstore import RevocationStore
from shared.bus import streams
from shared.bus.subjects import Names
from shared.config import LogSettings
from shared.kube.client import KubeClient
from shared.logging import configure as configure_logging
from tests.integration.security.callout_stack import (
    DRIVER,
    NAMESPACE,
    CalloutStack,
    callout_stack,
    connected,
)
from tests.integration.security.quota_attack import FLOODS, Flood, flood, steady_puts
from tests.integration.security.secure_nats import eventually

__all__ = ["BusQuotaFigures", "ledger_bytes", "main", "measure_bus_quota"]

_A, _B = "node-a", "node-b"
_N = Names("")
_TYPICAL = {"dra_inventory": 1, "dra_health": 16, "dra_claims": 8}
_NODES = 1000


@dataclass(frozen=True, slots=True)
class BusQuotaFigures:
    enforce_ms: list[float]
    attacker_keys: list[int]
    other_node_puts: int
    other_node_failures: int
    ledger_typical_bytes: int
    ledger_full_bytes: int

    def as_results(self) -> dict[str, Any]:
        return {
            "bus_quota_enforce_p50_ms": round(percentile(self.enforce_ms, 50), 1),
            "bus_quota_enforce_p99_ms": round(percentile(self.enforce_ms, 99), 1),
            "bus_quota_enforce_samples": len(self.enforce_ms),
            "bus_quota_attacker_keys_p99": round(percentile(self.attacker_keys, 99)),
            "bus_quota_other_node_puts": self.other_node_puts,
            "bus_quota_other_node_put_failures": self.other_node_failures,
            "bus_quota_ledger_kib_per_1000_nodes": round(self.ledger_typical_bytes / 1024),
            "bus_quota_ledger_kib_per_1000_full_nodes": round(self.ledger_full_bytes / 1024),
        }


def ledger_bytes(keys_per_bucket: dict[str, int], *, nodes: int = _NODES) -> int:
    """Memory a ledger holds for `nodes` nodes with that many keys each (`tracemalloc`)."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        ledger = QuotaLedger()
        for node in range(nodes):
            for base, keys in keys_per_bucket.items():
                owner = f"{Names.inventory_key(DRIVER, f'node-{node:05d}')}"
                if base == "dra_inventory":
                    ledger.observe(base, owner, 20_000, 1)
                    continue
                for index in range(keys):
                    ledger.observe(base, f"{owner}.device-{index}", 600, 1)
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(ledger) == nodes * len(keys_per_bucket)
    return used


async def _unrevoke(stack: CalloutStack, node: str) -> None:
    assert stack.config is not None
    assert stack.service is not None
    kube = await KubeClient.connect(stack.config.kube)
    try:
        await RevocationStore(kube, namespace=NAMESPACE).unrevoke(node)
    finally:
        await kube.close()
    revoker = stack.service.revoker
    await eventually(lambda: not revoker.revoked(node), timeout_s=10)


async def _trial(stack: CalloutStack, kind: str) -> tuple[Flood, int, int]:
    attack = FLOODS[kind]
    bucket = attack.bucket(_N)
    b_settings = await stack.agent_settings(attack.account, _B)
    role = attack.account.removeprefix("dra-")
    async with (
        connected(b_settings, component=role, node=_B) as b,
        steady_puts(b, bucket) as steady,
    ):
        result = await flood(
            stack, attack, _A, value_size=streams.limits_of(bucket).max_msg_size - 512
        )
        await asyncio.sleep(0.3)
    await _unrevoke(stack, _A)
    return result, steady.done, len(steady.failed)


async def measure_bus_quota(*, workdir: Path, trials: int = 5) -> BusQuotaFigures:
    enforce_ms: list[float] = []
    keys: list[int] = []
    puts = failures = 0
    async with (
        APIServerEmulator(ClusterConfig.for_tests("1.36")) as kube,
        callout_stack(kube, workdir) as stack,
    ):
        assert stack.service is not None
        await asyncio.wait_for(stack.service.auditor.synced.wait(), 10)
        for trial in range(trials):
            for kind in sorted(FLOODS):
                result, done, failed = await _trial(stack, kind)
                if result.enforce_s is None:
                    raise RuntimeError(f"trial {trial} ({kind}): the attacker was not cut off")
                enforce_ms.append(result.enforce_s * 1000)
                keys.append(result.sent)
                puts, failures = puts + done, failures + failed
    full = {base: limit.keys for base in _TYPICAL if (limit := quota.quota_of(base))}
    return BusQuotaFigures(
        enforce_ms=enforce_ms, attacker_keys=keys, other_node_puts=puts,
        other_node_failures=failures, ledger_typical_bytes=ledger_bytes(_TYPICAL),
        ledger_full_bytes=ledger_bytes(full, nodes=100) * (_NODES // 100),
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(prog="bench.bus_quota")
    parser.add_argument("--out", type=Path, default=Path("bench/results.json"))
    parser.add_argument("--trials", type=int, default=5, help="floods of each bucket")
    args = parser.parse_args()
    configure_logging(LogSettings(level="error", format="console"), service="bench")
    with tempfile.TemporaryDirectory(prefix="dra-bench-") as tmp:
        figures = asyncio.run(measure_bus_quota(workdir=Path(tmp), trials=args.trials))
    results: dict[str, Any] = json.loads(args.out.read_text()) if args.out.exists() else {}
    results.update(figures.as_results())
    args.out.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    print(json.dumps(figures.as_results(), indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
