"""`bus_restore_*`: seconds from another node's attack on a node's record to the owner's valid
record being back in the bucket, on the secured bus.

A real nats-server with the auth callout (sealed with an xkey), dra-nats-auth in-process against
the API emulator (it admits each identity and certifies its writer key), `--bus-signatures
enforce` for every client. Node B's owners run as the agents run them: the discovery agent's
inventory publisher and its guard, the health agent's recorder and its guard (a record of one
GPU), the allocation agent's prepared-claims writer and its guard (one claim). Node A, with its
own real credentials, attacks each of B's keys in turn, `samples` times:

* `inventory_emptied`, `health_emptied`, `claim_emptied`: a direct get of a key A has no value
  on (404), its answer sent to B's key as reply subject, which nats-server stores there;
* `inventory_forged`: A signs an inventory naming node B with the last generation on its own
  key, and has the server copy it onto B's key the same way.

A sample is the time from just before the attacker's publish until the key holds, above the
attack's entry, a record that passes the readers' check (signed by B's owner): polled with
direct gets every millisecond or so. The owners' re-assert pace is set out of the way, so that
every sample is a first re-put (the pace bounds a flood: tests/integration/security).
Run alone: `python -m bench.bus_restore`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import secrets
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import nats.js.errors
import nkeys  # type: ignore[import-untyped]  # ships no type hints

from bench import results_file
from bench.stats import percentile
from devcluster.apiserver import APIServerEmulator, ClusterConfig
from devcluster.natsauth import AuthCallout, ServerAuth
from devcluster.natsserver import NATSServerProcess
from services.allocation.claim.checkpoint import ClaimState, PreparedClaim, PreparedDevice
from services.allocation.claim.claims import ClaimRef, PodRef
from services.allocation.dra.claim_publisher import PreparedClaimPublisher
from services.discovery import inventory
from services.discovery.publisher import InventoryPublisher
from services.discovery.scanner import DeviceScanner
from services.health import instruments as health_instruments
from services.health.recorder import HealthRecorder
from services.natsauth.agent import AuthService
from services.natsauth.config import AuthServiceConfig
from services.natsauth.keys import SigningKey, XKey, new_signing_seed, new_xkey_seed
from shared.bus import codec, ownkeys
from shared.bus.connection import Bus
from shared.bus.session import open_bus
from shared.bus.subjects import Names
from shared.config import KubeSettings, LogSettings, NATSSettings
from shared.logging import configure as configure_logging
from shared.pb.drasuite.v1 import health_pb2, inventory_pb2
from shared.supervisor import run_agent
from shared.vendors.sim import discovery as sim

__all__ = ["ATTACKS", "measure_bus_restore"]

ATTACKS = ("inventory_emptied", "inventory_forged", "health_emptied", "claim_emptied")
_NS, _AUDIENCE, _DRIVER = "dra-suite", "nats.dra-suite.io", "sim.dra-suite.io"
_A, _B = "node-a", "node-b"
_ACCOUNTS = {"discovery": "dra-discovery", "allocation": "dra-allocation", "health": "dra-health"}
_OPERATOR = "dra-operator"
_N = Names("")
_DAY_S = 86_400.0
_RESTORE_TIMEOUT_S = 30.0


# The owners' pace out of the way: each sample measures a first re-put, not a throttled one.
def _unpaced() -> ownkeys.ReassertPace:
    return ownkeys.ReassertPace(burst=1 << 30)


def _make_dir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)


def _secret(path: Path, text: str) -> str:
    path.write_text(text + "\n")
    path.chmod(0o600)
    return str(path)


def _populate(kube: APIServerEmulator) -> None:
    kube.create_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": _NS}})
    for account in (*_ACCOUNTS.values(), _OPERATOR):
        kube.create_object({"apiVersion": "v1", "kind": "ServiceAccount",
                            "metadata": {"name": account, "namespace": _NS}})  # fmt: skip
    for node in (_A, _B):
        kube.create_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
        for account in _ACCOUNTS.values():
            kube.create_object({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"{account}-{node}", "namespace": _NS},
                "spec": {"nodeName": node, "serviceAccountName": account,
                         "containers": [{"name": "agent", "image": "dra-suite"}]},
            })  # fmt: skip


class _Stack:
    """The secured bus: who may connect, as whom, and the settings each client gets."""

    def __init__(self, workdir: Path, kube: APIServerEmulator, url: str, auth_key: str) -> None:
        self.workdir, self.kube, self.url, self.auth_key = workdir, kube, url, auth_key
        self._files = 0

    async def settings(self, account: str, node: str = "") -> NATSSettings:
        spec: dict[str, Any] = {"audiences": [_AUDIENCE]}
        if node:
            name = f"{account}-{node}"
            pod = self.kube.get_object("pods", name, _NS)
            assert pod is not None
            spec["boundObjectRef"] = {"kind": "Pod", "apiVersion": "v1", "name": name,
                                      "uid": pod["metadata"]["uid"]}  # fmt: skip
        url = f"{self.kube.url}/api/v1/namespaces/{_NS}/serviceaccounts/{account}/token"
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
        async with aiohttp.ClientSession() as session, session.post(url, json=body) as answer:
            token = str((await answer.json())["status"]["token"])
        self._files += 1
        return NATSSettings(
            url=self.url, token_file=_secret(self.workdir / f"token-{self._files}", token),
            connect_timeout_s=5.0, request_timeout_s=5.0,
            bus_signatures="enforce", bus_auth_key_file=self.auth_key,
        )  # fmt: skip

    @contextlib.asynccontextmanager
    async def bus(self, role: str, node: str = "") -> AsyncIterator[Bus]:
        account = _ACCOUNTS.get(role, _OPERATOR)
        settings = await self.settings(account, node)
        async with open_bus(
            settings, timeout_s=20, name=f"bench-{role}", component=role, node=node
        ) as bus:
            yield bus


@contextlib.asynccontextmanager
async def _secured_bus(workdir: Path) -> AsyncIterator[_Stack]:
    """nats-server with the auth callout and dra-nats-auth (certifying writer keys), running."""
    issuer_seed, xkey_seed = new_signing_seed(nkeys.PREFIX_BYTE_ACCOUNT), new_xkey_seed()
    certify_seed = new_signing_seed(nkeys.PREFIX_BYTE_OPERATOR)
    password = secrets.token_urlsafe(16)
    callout = AuthCallout(
        issuer=SigningKey.from_seed(issuer_seed, nkeys.PREFIX_BYTE_ACCOUNT).public,
        auth_password=password, xkey=XKey.from_seed(xkey_seed).public,
    )  # fmt: skip
    server = NATSServerProcess(workdir / "nats", auth=ServerAuth(callout=callout))
    server.start()
    try:
        async with APIServerEmulator(ClusterConfig.for_tests()) as kube:
            _populate(kube)
            service = AuthService(AuthServiceConfig(
                nats=NATSSettings(url=server.url, user="dra-nats-auth",
                                  password_file=_secret(workdir / "password", password)),
                kube=KubeSettings(kubeconfig=str(kube.write_kubeconfig(workdir / "kubeconfig"))),
                issuer_seed_file=_secret(workdir / "issuer.seed", issuer_seed),
                xkey_seed_file=_secret(workdir / "xkey.seed", xkey_seed),
                certify_seed_file=_secret(workdir / "certify.seed", certify_seed),
                operator_users=(f"system:serviceaccount:{_NS}:{_OPERATOR}",),
                driver_name=(_DRIVER,),
            ))  # fmt: skip
            stop = asyncio.Event()
            task = asyncio.create_task(
                run_agent(service, grace_s=5, stop=stop, handle_signals=False)
            )
            try:
                await asyncio.wait_for(service.subscribed.wait(), 20)
                await asyncio.wait_for(service.provisioner.done.wait(), 20)
                if service.certifier is not None:
                    await asyncio.wait_for(service.certifier.serving.wait(), 20)
                certify_pub = SigningKey.from_seed(certify_seed, nkeys.PREFIX_BYTE_OPERATOR).public
                auth_key = _secret(workdir / "certify.pub", certify_pub)
                yield _Stack(workdir, kube, server.url, auth_key)
            finally:
                stop.set()
                await asyncio.wait_for(task, 10)
    finally:
        server.stop()


@contextlib.asynccontextmanager
async def _owners_of_b(stack: _Stack) -> AsyncIterator[None]:
    """Node B's three owners with their guards, each on its own identity, records written."""
    async with (
        stack.bus("discovery", _B) as discovery,
        stack.bus("health", _B) as health,
        stack.bus("allocation", _B) as allocation,
    ):
        identity = inventory.Identity(driver=_DRIVER, node=_B, pool=_B, backend="sim")
        scanner = DeviceScanner(sim.SimBackend.from_profile("gpu"), identity=identity,
                                interval_s=_DAY_S)  # fmt: skip
        publisher = InventoryPublisher(discovery, scanner, driver=_DRIVER, node=_B)
        recorder = HealthRecorder(health, driver=_DRIVER, node=_B, refresh_s=_DAY_S)
        recorder.set({"gpu-0": health_pb2.DeviceHealth(
            driver=_DRIVER, node=_B, pool=_B, device="gpu-0",
            state=health_pb2.HEALTH_STATE_HEALTHY, since_unix_ms=int(time.time() * 1000),
        )})  # fmt: skip
        claims = PreparedClaimPublisher(allocation, driver=_DRIVER, node=_B, lookup=_no_pods)
        claims.prepared(_claim(), pods=[PodRef(namespace="team", name="trainer-0", uid="p0")])
        tasks = [
            asyncio.create_task(scanner.run()),
            asyncio.create_task(publisher.run()),
            asyncio.create_task(publisher.guard(pace=_unpaced())),
            asyncio.create_task(
                recorder.guard(
                    counter=health_instruments.HEALTH_RECORDS_REASSERTED, pace=_unpaced()
                )
            ),
            asyncio.create_task(claims.run()),
            asyncio.create_task(claims.guard(pace=_unpaced())),
        ]
        try:
            assert await recorder.flush()
            await asyncio.wait_for(publisher.published.wait(), 20)
            await asyncio.wait_for(claims.synced.wait(), 20)
            yield
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def _no_pods(ref: ClaimRef) -> tuple[PodRef, ...]:
    return ()


_CLAIM_UID = "5b1e2c3d-0000-4000-8000-0000000000b0"


def _claim() -> PreparedClaim:
    device = PreparedDevice(request_names=("gpu",), pool=_B, device="gpu-0",
                            cdi_device_ids=(f"{_DRIVER}/gpu=gpu-0",))  # fmt: skip
    return PreparedClaim(uid=_CLAIM_UID, namespace="team", name="train", driver=_DRIVER,
                         state=ClaimState.PREPARE_COMPLETED, devices=(device,))  # fmt: skip


async def _restore_s(
    admin: Bus, bucket: str, key: str, attack: Callable[[], Awaitable[None]]
) -> float:
    """Seconds from the attack until `key` holds a valid record newer than the attack's."""
    stream, subject = _N.kv_stream(bucket), _N.kv_subject(bucket, key)
    before = await _last_sequence(admin, stream, subject)
    started = time.perf_counter()
    await attack()
    deadline = started + _RESTORE_TIMEOUT_S
    while time.perf_counter() < deadline:
        # Above the attack's own entry (which no reader takes) only the owner writes validly.
        landed = await _last_sequence(admin, stream, subject) > before
        if landed and await admin.checked_get(bucket, key) is not None:
            return time.perf_counter() - started
        await asyncio.sleep(0.001)
    raise TimeoutError(f"{key} not restored within {_RESTORE_TIMEOUT_S}s")


async def _last_sequence(admin: Bus, stream: str, subject: str) -> int:
    try:
        return int((await admin.js.get_msg(stream, subject=subject, direct=True)).seq or 0)
    except nats.js.errors.NotFoundError:
        return 0


async def measure_bus_restore(*, workdir: Path, samples: int = 50) -> dict[str, Any]:
    _make_dir(workdir)
    taken: dict[str, list[float]] = {attack: [] for attack in ATTACKS}
    async with (
        _secured_bus(workdir) as stack,
        _owners_of_b(stack),
        stack.bus("operator") as admin,
        stack.bus("health", _A) as health_a,
        stack.bus("discovery", _A) as discovery_a,
    ):
        forged = inventory_pb2.Inventory(driver=_DRIVER, node=_B, generation=2**63 - 1)
        forged.devices.add(name="gpu-0")
        await discovery_a.kv_put(_N.inventory_bucket, _N.inventory_key(_DRIVER, _A),
                                 codec.encode(forged))  # fmt: skip

        def redirect(via: Bus, get: str, bucket: str, key: str) -> Callable[[], Awaitable[None]]:
            async def attack() -> None:
                await via.nc.publish(get, b"", reply=_N.kv_subject(bucket, key))
                await via.nc.flush()

            return attack

        # Node A's health agent has no record of a device "absent": the server answers 404.
        missing = _N.js_direct_get(_N.health_bucket, _N.health_key(_DRIVER, _A, "absent"))
        copied = _N.js_direct_get(_N.inventory_bucket, _N.inventory_key(_DRIVER, _A))
        targets = {
            "inventory_emptied": (health_a, missing, _N.inventory_bucket,
                                  _N.inventory_key(_DRIVER, _B)),
            "inventory_forged": (discovery_a, copied, _N.inventory_bucket,
                                 _N.inventory_key(_DRIVER, _B)),
            "health_emptied": (health_a, missing, _N.health_bucket,
                               _N.health_key(_DRIVER, _B, "gpu-0")),
            "claim_emptied": (health_a, missing, _N.claims_bucket,
                              _N.claim_key(_DRIVER, _B, _CLAIM_UID)),
        }  # fmt: skip
        for _ in range(samples):
            for name, (via, get, bucket, key) in targets.items():
                attack = redirect(via, get, bucket, key)
                taken[name].append(await _restore_s(admin, bucket, key, attack))
                await asyncio.sleep(0.01)  # the owner's own put seen by its guard
    every = [s for values in taken.values() for s in values]
    results: dict[str, Any] = {
        "bus_restore_p50_s": round(percentile(every, 50), 4),
        "bus_restore_p99_s": round(percentile(every, 99), 4),
        "bus_restore_samples": len(every),
    }
    for name, values in taken.items():
        results[f"bus_restore_{name}_p99_s"] = round(percentile(values, 99), 4)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(prog="bench.bus_restore")
    parser.add_argument("--out", type=Path, default=Path("bench/results.json"))
    parser.add_argument("--samples", type=int, default=50, help="attacks of each kind")
    args = parser.parse_args()
    configure_logging(LogSettings(level="error", format="console"), service="bench")
    with tempfile.TemporaryDirectory(prefix="dra-bench-") as tmp:
        figures = asyncio.run(measure_bus_restore(workdir=Path(tmp), samples=args.samples))
    results_file.merge(args.out, figures)
    print(json.dumps(figures, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
