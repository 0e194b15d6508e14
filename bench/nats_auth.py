"""`nats_connect_auth_*`: an agent's NATS connect through the auth callout, p50/p99 over N.

A real nats-server with auth callout (sealed with an xkey), dra-nats-auth in-process against
the API emulator, and a health agent's projected-style token: each connect runs the whole
path (CONNECT, the server's sealed request, TokenReview over HTTP, the signed user JWT). The
same connect to an open server is the baseline. The burst is a reconnect storm: `BURST`
agents connecting at once, until the last one is in. The flood is an attack: `JUNK` clients
with junk tokens connecting from a process of their own while agents connect one after the
other, each with a token never seen before (so each costs a real TokenReview);
`nats_connect_auth_flood_success_ratio` is the share of those connects that got in, and their
p99 is set against the same fresh-token connects without the flood. The CPU seconds that
nats-server, the attacker's process and this process (auth service, API emulator and the
agents' connects) spent during the flood show who had the machine.
Run alone: `python -m bench.nats_auth`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import nats
import nats.aio.client
import nats.errors
import nkeys  # type: ignore[import-untyped]  # ships no type hints

from bench.junk_connects import FloodProcess, FloodResult
from bench.stats import percentile
from devcluster.apiserver import APIServerEmulator, ClusterConfig
from devcluster.natsauth import AuthCallout, ServerAuth
from devcluster.natsserver import NATSServerProcess
from services.natsauth.agent import AuthService
from services.natsauth.config import AuthServiceConfig
from services.natsauth.keys import SigningKey, XKey, new_signing_seed, new_xkey_seed
from shared import nats_auth
from shared.bus.subjects import Names
from shared.config import KubeSettings, LogSettings, NATSSettings
from shared.logging import configure as configure_logging
from shared.supervisor import run_agent

__all__ = ["NATSAuthFigures", "measure_nats_auth"]

_NS, _NODE, _ACCOUNT = "dra-suite", "node-a", "dra-health"
BURST = 200
JUNK = 1500
FLOOD_TOKENS = 10
"""Fresh tokens made for the flood, per baseline connect."""


@dataclass(frozen=True, slots=True)
class NATSAuthFigures:
    auth_ms: list[float]
    open_ms: list[float]
    burst_s: float
    burst_refused: int
    """Clients of the burst refused (the server's auth timeout passed); agents retry them."""
    fresh_ms: list[float]
    """Connects with a new token each, no flood: the baseline of the flood's figures."""
    flood_ms: list[float]
    """Connects that got in while the junk flood ran, a new token each."""
    flood_failed: int
    flood: FloodResult
    server_cpu_s: float
    """nats-server's CPU seconds while the flood ran."""
    bench_cpu_s: float
    """This process's (auth service, API emulator, agents' connects) while the flood ran."""

    def as_results(self) -> dict[str, Any]:
        return {
            "nats_connect_auth_p50_ms": round(percentile(self.auth_ms, 50), 3),
            "nats_connect_auth_p99_ms": round(percentile(self.auth_ms, 99), 3),
            "nats_connect_auth_samples": len(self.auth_ms),
            "nats_connect_open_p50_ms": round(percentile(self.open_ms, 50), 3),
            "nats_connect_open_p99_ms": round(percentile(self.open_ms, 99), 3),
            f"nats_connect_auth_burst_{BURST}_s": round(self.burst_s, 3),
            f"nats_connect_auth_burst_{BURST}_refused": self.burst_refused,
            "nats_connect_auth_fresh_p99_ms": round(percentile(self.fresh_ms, 99), 3),
            "nats_connect_auth_flood_p99_ms": round(percentile(self.flood_ms, 99), 3),
            "nats_connect_auth_flood_success_ratio": round(
                len(self.flood_ms) / max(1, len(self.flood_ms) + self.flood_failed), 4
            ),
            "nats_connect_auth_flood_samples": len(self.flood_ms) + self.flood_failed,
            "nats_connect_auth_flood_junk": JUNK,
            "nats_connect_auth_flood_junk_refused": self.flood.refused,
            "nats_connect_auth_flood_s": round(self.flood.seconds, 3),
            "nats_connect_auth_flood_cpu_s_attacker": round(self.flood.cpu_s, 3),
            "nats_connect_auth_flood_cpu_s_nats_server": round(self.server_cpu_s, 3),
            "nats_connect_auth_flood_cpu_s_auth_and_agents": round(self.bench_cpu_s, 3),
        }


def _populate(kube: APIServerEmulator) -> None:
    kube.create_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": _NS}})
    kube.create_object(
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": _ACCOUNT, "namespace": _NS},
        }
    )
    kube.create_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": _NODE}})
    kube.create_object({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "health-a", "namespace": _NS},
        "spec": {"nodeName": _NODE, "serviceAccountName": _ACCOUNT,
                 "containers": [{"name": "agent", "image": "dra-suite"}]},
    })  # fmt: skip


async def _token(kube: APIServerEmulator) -> str:
    pod = kube.get_object("pods", "health-a", _NS)
    assert pod is not None
    ref = {"kind": "Pod", "apiVersion": "v1", "name": "health-a", "uid": pod["metadata"]["uid"]}
    body = {
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"audiences": ["nats.dra-suite.io"], "boundObjectRef": ref},
    }  # fmt: skip
    url = f"{kube.url}/api/v1/namespaces/{_NS}/serviceaccounts/{_ACCOUNT}/token"
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as answer:
        return str((await answer.json())["status"]["token"])


def _make_dir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)


def _secret(path: Path, text: str) -> str:
    path.write_text(text + "\n")
    path.chmod(0o600)
    return str(path)


async def _connects(settings: NATSSettings, *, count: int) -> list[float]:
    """Milliseconds from `nats.connect` to a connected client, as the agents' Bus connects."""
    inbox = Names(settings.namespace).inbox_prefix("health", _NODE)
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        nc = await nats.connect(
            settings.url, inbox_prefix=inbox, allow_reconnect=False,
            **nats_auth.connect_options(settings),
        )  # fmt: skip
        samples.append((time.perf_counter() - started) * 1000)
        await nc.close()
    return samples


async def _burst(settings: NATSSettings) -> tuple[float, int]:
    """Seconds until `BURST` clients connecting at once are all answered, and how many of
    them were refused."""
    inbox = Names(settings.namespace).inbox_prefix("health", _NODE)
    options = nats_auth.connect_options(settings)
    started = time.perf_counter()
    answers = await asyncio.gather(*(
        nats.connect(settings.url, inbox_prefix=inbox, allow_reconnect=False,
                     connect_timeout=10, **options)
        for _ in range(BURST)
    ), return_exceptions=True)  # fmt: skip
    took = time.perf_counter() - started
    clients = [nc for nc in answers if isinstance(nc, nats.aio.client.Client)]
    await asyncio.gather(*(nc.close() for nc in clients))
    return took, BURST - len(clients)


async def _connect_once(settings: NATSSettings) -> float | None:
    """Milliseconds to connect with `settings`' token, or None when refused or timed out."""
    inbox = Names(settings.namespace).inbox_prefix("health", _NODE)
    started = time.perf_counter()
    try:
        nc = await nats.connect(
            settings.url, inbox_prefix=inbox, allow_reconnect=False, connect_timeout=5,
            max_reconnect_attempts=0, **nats_auth.connect_options(settings),
        )  # fmt: skip
    except (nats.errors.Error, OSError):
        return None
    took = (time.perf_counter() - started) * 1000
    await nc.close()
    return took


def _cpu_s(pid: int | None) -> float:
    """CPU seconds (user and system) process `pid` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _fresh_connects(
    tokens: list[str], url: str, workdir: Path, *, until: asyncio.Task[Any] | None
) -> tuple[list[float], int]:
    """Connects with a new token each, all of `tokens` or (with `until`) as long as it runs."""
    samples: list[float] = []
    failed = 0
    for index, token in enumerate(tokens):
        if until is not None and until.done():
            break
        path = _secret(workdir / f"fresh-{index}", token)
        took = await _connect_once(NATSSettings(url=url, token_file=path))
        if took is None:
            failed += 1
        else:
            samples.append(took)
    return samples, failed


async def measure_nats_auth(*, workdir: Path, connects: int = 200) -> NATSAuthFigures:
    _make_dir(workdir)
    issuer_seed, xkey_seed = new_signing_seed(nkeys.PREFIX_BYTE_ACCOUNT), new_xkey_seed()
    password = secrets.token_urlsafe(16)
    callout = AuthCallout(
        issuer=SigningKey.from_seed(issuer_seed, nkeys.PREFIX_BYTE_ACCOUNT).public,
        auth_password=password, xkey=XKey.from_seed(xkey_seed).public,
    )  # fmt: skip
    with contextlib.ExitStack() as servers:
        secured = NATSServerProcess(workdir / "secured", auth=ServerAuth(callout=callout))
        plain = NATSServerProcess(workdir / "open")
        for server in (secured, plain):
            server.start()
            servers.callback(server.stop)
        async with APIServerEmulator(ClusterConfig.for_tests()) as kube:
            _populate(kube)
            service = AuthService(AuthServiceConfig(
                nats=NATSSettings(url=secured.url, user="dra-nats-auth",
                                  password_file=_secret(workdir / "password", password)),
                kube=KubeSettings(kubeconfig=str(kube.write_kubeconfig(workdir / "kubeconfig"))),
                issuer_seed_file=_secret(workdir / "issuer.seed", issuer_seed),
                xkey_seed_file=_secret(workdir / "xkey.seed", xkey_seed),
                # Every agent here connects from 127.0.0.1: one address's review budget
                # would refuse the fresh-token connects, which stand for many nodes.
                reviews_per_source=0,
            ))  # fmt: skip
            stop = asyncio.Event()
            task = asyncio.create_task(
                run_agent(service, grace_s=5, stop=stop, handle_signals=False)
            )
            try:
                await asyncio.wait_for(service.subscribed.wait(), 10)
                token_file = _secret(workdir / "token", await _token(kube))
                agent = NATSSettings(url=secured.url, token_file=token_file)
                auth_ms = await _connects(agent, count=connects)
                burst_s, burst_refused = await _burst(agent)
                open_ms = await _connects(NATSSettings(url=plain.url), count=connects)
                # Enough for the whole flood, which lasts while junk waits out the server's
                # auth timeout.
                tokens = [await _token(kube) for _ in range(connects * FLOOD_TOKENS)]
                fresh_ms, _ = await _fresh_connects(
                    tokens[:connects], secured.url, workdir, until=None
                )
                server_cpu, bench_cpu = _cpu_s(secured.pid), time.process_time()
                attack = await FloodProcess.start(secured.url, JUNK, kid=kube.cluster.tokens.key_id)
                junk = asyncio.create_task(attack.result())
                flood_ms, flood_failed = await _fresh_connects(
                    tokens[connects:], secured.url, workdir, until=junk
                )
                flood = await junk
                server_cpu = _cpu_s(secured.pid) - server_cpu
                bench_cpu = time.process_time() - bench_cpu
            finally:
                stop.set()
                await asyncio.wait_for(task, 10)
    return NATSAuthFigures(
        auth_ms=auth_ms, open_ms=open_ms, burst_s=burst_s, burst_refused=burst_refused,
        fresh_ms=fresh_ms, flood_ms=flood_ms, flood_failed=flood_failed, flood=flood,
        server_cpu_s=server_cpu, bench_cpu_s=bench_cpu,
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(prog="bench.nats_auth")
    parser.add_argument("--out", type=Path, default=Path("bench/results.json"))
    parser.add_argument("--connects", type=int, default=200)
    args = parser.parse_args()
    configure_logging(LogSettings(level="warning", format="console"), service="bench")
    with tempfile.TemporaryDirectory(prefix="dra-bench-") as tmp:
        figures = asyncio.run(measure_nats_auth(workdir=Path(tmp), connects=args.connects))
    results: dict[str, Any] = json.loads(args.out.read_text()) if args.out.exists() else {}
    results.update(figures.as_results())
    args.out.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    print(json.dumps(figures.as_results(), indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
