"""NodePrepareResources latency for single-device claims, against the real local stack.

The agents, the API emulator and nats-server run as separate processes (LocalStack); this
process plays kubelet. Each sample is one prepare call of a fresh claim: claim GET, CDI write
and checkpoint included. The floor is measured in the same run, against the same emulator: one
floor iteration before each prepare, so that machine noise falls on both alike.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from bench.cdi_dir import node_like_cdi_dir
from bench.floor import FloorIteration, floor_probe
from bench.stats import percentile
from devcluster import flow
from devcluster.kubelet import KubeletClaim, KubeletEmulator
from devcluster.stack import LocalStack, StackConfig
from shared.bus.session import open_bus
from shared.kube.client import KubeClient

__all__ = ["PrepareFigures", "allocated_claims", "measure_prepare", "timed_prepare"]

NAMESPACE = "bench"


ROUNDS = 5
"""Rounds of the same claims (prepared, then all unprepared). Their p99s are reported by
median: a p99 of a few hundred samples rests on its few worst, and one disk stall of a shared
machine (tens of ms, on the floor as often as on the prepare) would otherwise decide it."""


@dataclass(frozen=True, slots=True)
class PrepareFigures:
    rounds: list[tuple[list[float], list[float]]]
    """(prepare ms, floor ms) of each round, one floor iteration before each prepare."""

    def as_results(self) -> dict[str, float]:
        prepare = [ms for round_ms, _ in self.rounds for ms in round_ms]
        floor = [ms for _, floor_ms in self.rounds for ms in floor_ms]
        p99 = statistics.median(percentile(r, 99) for r, _ in self.rounds)
        floor_p99 = statistics.median(percentile(f, 99) for _, f in self.rounds)
        return {
            "prepare_p50_ms": round(percentile(prepare, 50), 3),
            "prepare_p99_ms": round(p99, 3),
            "prepare_p99_pooled_ms": round(percentile(prepare, 99), 3),
            "prepare_floor_p50_ms": round(percentile(floor, 50), 3),
            "prepare_floor_p99_ms": round(floor_p99, 3),
            "prepare_floor_p99_pooled_ms": round(percentile(floor, 99), 3),
            "prepare_p99_to_floor_p99_ratio": round(p99 / floor_p99, 2),
            "prepare_samples": len(prepare),
            "prepare_rounds": len(self.rounds),
        }


async def measure_prepare(
    *, workdir: Path, iterations: int, warmup: int = 20, rounds: int = ROUNDS
) -> PrepareFigures:
    with node_like_cdi_dir() as cdi_dir:
        config = StackConfig(
            workdir=workdir / "stack", node_name="bench-node", log_level="warning", cdi_dir=cdi_dir
        )
        async with LocalStack(config) as stack:
            claims = await _claims(stack, count=warmup + iterations)
            kubelet = KubeletEmulator(config.registry_dir)
            try:
                await kubelet.register(driver=config.driver_name)
                get_url = _claim_url(stack, claims[0])
                async with floor_probe(workdir=workdir, get_url=get_url) as probe:
                    await _round(kubelet, probe, claims[:warmup])
                    measured = [
                        await _round(kubelet, probe, claims[warmup:]) for _ in range(rounds)
                    ]
            finally:
                await kubelet.close()
    return PrepareFigures(rounds=measured)


async def _claims(stack: LocalStack, *, count: int) -> list[KubeletClaim]:
    config = stack.config
    async with open_bus(stack.nats_settings) as bus, stack.kube() as kube:
        inventory = await flow.wait_inventory(bus, driver=config.driver_name, node=config.node_name)
        return await allocated_claims(
            kube,
            config=config,
            devices=[d.name for d in inventory.devices],
            count=count,
            namespace=NAMESPACE,
        )


async def _round(
    kubelet: KubeletEmulator, probe: FloorIteration, claims: list[KubeletClaim]
) -> tuple[list[float], list[float]]:
    """Prepare each claim after one floor iteration, then unprepare them all."""
    prepare_ms: list[float] = []
    floor_ms: list[float] = []
    for claim in claims:
        floor_ms.append(await probe())
        prepare_ms.append(await timed_prepare(kubelet, claim))
    await kubelet.unprepare(claims)
    return prepare_ms, floor_ms


async def timed_prepare(kubelet: KubeletEmulator, claim: KubeletClaim) -> float:
    """Milliseconds of one NodePrepareResources call for `claim`, which must succeed."""
    start = time.perf_counter()
    answer = await kubelet.prepare([claim])
    elapsed = (time.perf_counter() - start) * 1000
    if answer.claims[claim.uid].error:
        raise RuntimeError(f"bench prepare failed: {answer.claims[claim.uid].error}")
    return elapsed


async def allocated_claims(
    kube: KubeClient, *, config: StackConfig, devices: list[str], count: int, namespace: str
) -> list[KubeletClaim]:
    """`count` single-device claims, allocated round-robin over `devices` as the scheduler
    would; made concurrently (setup, not measured)."""

    async def one(i: int) -> KubeletClaim:
        created = await flow.create_claim(
            kube,
            namespace=namespace,
            name=f"claim-{i}",
            device_class="npu.sim.dra-suite.io",
            count=1,
            cel="true",
        )
        allocated = await flow.allocate_claim(
            kube,
            created,
            driver=config.driver_name,
            node=config.node_name,
            devices=[devices[i % len(devices)]],
        )
        return flow.kubelet_claim(allocated)

    return list(await asyncio.gather(*(one(i) for i in range(count))))


def _claim_url(stack: LocalStack, claim: KubeletClaim) -> str:
    kubeconfig = yaml.safe_load(stack.config.kubeconfig.read_text())
    server = kubeconfig["clusters"][0]["cluster"]["server"]
    return (
        f"{server}/apis/resource.k8s.io/v1/namespaces/{claim.namespace}/resourceclaims/{claim.name}"
    )
