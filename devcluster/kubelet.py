"""A kubelet stand-in for the plugin side of DRA: registration, prepare/unprepare, health.

It talks to a plugin the way the kubelet does (docs/contracts.md §1-3): finds `*-reg.sock` in the
registry dir (dotfiles ignored), GetInfo (1 s), validates the answer, picks the first DRA
service version the plugin lists that it knows, reports the verdict with
NotifyRegistrationStatus (5 s), then uses one connection for DRA and health calls, each DRA
call within the kubelet's 45 s deadline, and rejects answers that skip or invent claim UIDs.
Answers always come back as v1 messages (the kubelet converts v1beta1 the same way).

`reject_registrations=N` makes the first N registrations that pass validation fail the way a
failing DRA handler does in the kubelet: the plugin manager has already recorded the socket
(path and the time it appeared) as registered, reports `plugin_registered=false`, and does not
try that socket again; only a socket created anew (a new inode or ctime here) is registered.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import grpc

from shared.pb.kubelet.dra.v1 import api_pb2 as dra_v1
from shared.pb.kubelet.dra.v1 import api_pb2_grpc as dra_v1_grpc
from shared.pb.kubelet.dra.v1beta1 import api_pb2 as dra_v1beta1
from shared.pb.kubelet.dra.v1beta1 import api_pb2_grpc as dra_v1beta1_grpc
from shared.pb.kubelet.drahealth.v1 import api_pb2 as health_v1
from shared.pb.kubelet.drahealth.v1 import api_pb2_grpc as health_v1_grpc
from shared.pb.kubelet.drahealth.v1alpha1 import api_pb2 as health_v1alpha1
from shared.pb.kubelet.drahealth.v1alpha1 import api_pb2_grpc as health_v1alpha1_grpc
from shared.pb.kubelet.pluginregistration.v1 import api_pb2 as reg
from shared.pb.kubelet.pluginregistration.v1 import api_pb2_grpc as reg_grpc

__all__ = [
    "CALL_TIMEOUT_S",
    "KNOWN_DRA_VERSIONS",
    "KubeletClaim",
    "KubeletEmulator",
    "KubeletError",
]

M = TypeVar("M")

# servicesSupportedByKubelet (1.34+), in the kubelet's own order.
KNOWN_DRA_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
CALL_TIMEOUT_S = 45.0  # defaultClientCallTimeout
_GET_INFO_TIMEOUT_S = 1.0
_NOTIFY_TIMEOUT_S = 5.0
_DIAL_TIMEOUT_S = 10.0
_PLUGIN_TYPE = "DRAPlugin"


class KubeletError(Exception):
    """What the kubelet would log and act on: a rejected plugin or a failed/invalid call."""


@dataclass(frozen=True, slots=True)
class KubeletClaim:
    """A claim as the kubelet names it in DRA calls."""

    namespace: str
    name: str
    uid: str


class KubeletEmulator:
    """`await kubelet.register()`, then `prepare`/`unprepare`/`watch_health`, then `close()`."""

    def __init__(
        self,
        registry_dir: Path,
        *,
        known_versions: Sequence[str] = KNOWN_DRA_VERSIONS,
        call_timeout_s: float = CALL_TIMEOUT_S,
        reject_registrations: int = 0,
    ) -> None:
        """`known_versions` emulates older kubelets (e.g. only `v1beta1.DRAPlugin`);
        `reject_registrations` fails that many valid registrations first (module doc)."""
        self.registry_dir = registry_dir
        self.known_versions = tuple(known_versions)
        self.call_timeout_s = call_timeout_s
        self.reject_registrations = reject_registrations
        self.rejected: list[str] = []
        """The error of each registration this emulator failed, in order."""
        self.info: reg.PluginInfo | None = None
        self.dra_version = ""
        self._channel: grpc.aio.Channel | None = None
        self._last_miss = ""
        """Why the last socket tried did not register, for the error when none does."""
        self._failed_sockets: set[tuple[Path, int, int]] = set()
        """Sockets (path, inode, ctime) recorded as registered although their handler failed."""

    async def register(
        self, *, driver: str | None = None, timeout_s: float = 10.0
    ) -> reg.PluginInfo:
        """Find the plugin's registration socket (waiting for it) and register it."""
        deadline = time.monotonic() + timeout_s
        self._last_miss = ""
        while True:
            for socket_path in self._registration_sockets():
                info = await self._try_register(socket_path, driver=driver)
                if info is not None:
                    return info
            if time.monotonic() >= deadline:
                missed = f" (the last one tried: {self._last_miss})" if self._last_miss else ""
                raise KubeletError(
                    f"no registration socket for {driver or 'any driver'} in {self.registry_dir}"
                    f" answered in {timeout_s:g} s{missed}"
                )
            await asyncio.sleep(0.05)

    def _registration_sockets(self) -> list[Path]:
        if not self.registry_dir.is_dir():
            return []
        return [
            path
            for path in sorted(self.registry_dir.glob("*-reg.sock"))
            if not path.name.startswith(".")
            and path.is_socket()
            and _identity(path) not in self._failed_sockets
        ]

    async def _try_register(
        self, socket_path: Path, *, driver: str | None
    ) -> reg.PluginInfo | None:
        async with grpc.aio.insecure_channel(f"unix:{socket_path}") as channel:
            stub = reg_grpc.RegistrationStub(channel)
            try:
                info = await stub.GetInfo(reg.InfoRequest(), timeout=_GET_INFO_TIMEOUT_S)
            except grpc.aio.AioRpcError as exc:
                # Not serving (yet); the kubelet retries on its next reconcile.
                self._last_miss = f"{socket_path.name}: GetInfo {exc.code().name}"
                return None
            if driver is not None and info.name != driver:
                self._last_miss = f"{socket_path.name}: serves {info.name}"
                return None
            try:
                self.dra_version = self._validate(info)
                if len(self.rejected) < self.reject_registrations:
                    # The plugin manager records the socket before the handler fails.
                    self._failed_sockets.add(_identity(socket_path))
                    await self._reject(stub)
                    return None
                endpoint = info.endpoint or str(socket_path)
                await self._dial(endpoint)
            except KubeletError as exc:
                # Plugins answer a rejection with an error (the Go helper does); expected here.
                with contextlib.suppress(grpc.aio.AioRpcError):
                    await stub.NotifyRegistrationStatus(
                        reg.RegistrationStatus(plugin_registered=False, error=str(exc)),
                        timeout=_NOTIFY_TIMEOUT_S,
                    )
                raise
            await self._call(
                "NotifyRegistrationStatus",
                stub.NotifyRegistrationStatus(
                    reg.RegistrationStatus(plugin_registered=True), timeout=_NOTIFY_TIMEOUT_S
                ),
            )
        self.info = info
        return info

    async def _reject(self, stub: reg_grpc.RegistrationAsyncStub) -> None:
        error = (
            "RegisterPlugin error -- plugin registration failed with err: rejected by the "
            f"kubelet emulator ({len(self.rejected) + 1} of {self.reject_registrations})"
        )
        self.rejected.append(error)
        with contextlib.suppress(grpc.aio.AioRpcError):  # the plugin answers with an error
            await stub.NotifyRegistrationStatus(
                reg.RegistrationStatus(plugin_registered=False, error=error),
                timeout=_NOTIFY_TIMEOUT_S,
            )

    def _validate(self, info: reg.PluginInfo) -> str:
        """The DRA service version to use, as the kubelet's ValidatePlugin picks it."""
        if info.type != _PLUGIN_TYPE:
            raise KubeletError(f"plugin type {info.type!r} is not {_PLUGIN_TYPE}")
        if not info.name:
            raise KubeletError("plugin name is empty")
        for version in info.supported_versions:
            if version in self.known_versions:
                return version
        raise KubeletError(
            f"none of services supported by the plugin ({list(info.supported_versions)}) "
            f"are supported by the kubelet ({list(self.known_versions)})"
        )

    async def _dial(self, endpoint: str) -> None:
        if self._channel is not None:
            await self._channel.close()
        channel = grpc.aio.insecure_channel(f"unix:{endpoint}")
        try:
            await asyncio.wait_for(channel.channel_ready(), _DIAL_TIMEOUT_S)
        except TimeoutError as exc:
            await channel.close()
            raise KubeletError(f"dial plugin endpoint {endpoint}: timed out") from exc
        self._channel = channel

    @property
    def channel(self) -> grpc.aio.Channel:
        if self._channel is None:
            raise KubeletError("no plugin registered")
        return self._channel

    async def prepare(self, claims: Sequence[KubeletClaim]) -> dra_v1.NodePrepareResourcesResponse:
        """NodePrepareResources for one pod's claims; per-claim errors stay in the answer."""
        method = "NodePrepareResources"
        if self.dra_version == "v1beta1.DRAPlugin":
            beta = dra_v1beta1.NodePrepareResourcesRequest(claims=[_beta(c) for c in claims])
            call_beta = dra_v1beta1_grpc.DRAPluginStub(self.channel).NodePrepareResources
            raw = await self._call(method, call_beta(beta, timeout=self.call_timeout_s))
            answer = dra_v1.NodePrepareResourcesResponse.FromString(raw.SerializeToString())
        else:
            request = dra_v1.NodePrepareResourcesRequest(claims=[_v1(c) for c in claims])
            call = dra_v1_grpc.DRAPluginStub(self.channel).NodePrepareResources
            answer = await self._call(method, call(request, timeout=self.call_timeout_s))
        _check_uids(method, claims, answer.claims.keys())
        return answer

    async def unprepare(
        self, claims: Sequence[KubeletClaim]
    ) -> dra_v1.NodeUnprepareResourcesResponse:
        method = "NodeUnprepareResources"
        if self.dra_version == "v1beta1.DRAPlugin":
            beta = dra_v1beta1.NodeUnprepareResourcesRequest(claims=[_beta(c) for c in claims])
            call_beta = dra_v1beta1_grpc.DRAPluginStub(self.channel).NodeUnprepareResources
            raw = await self._call(method, call_beta(beta, timeout=self.call_timeout_s))
            answer = dra_v1.NodeUnprepareResourcesResponse.FromString(raw.SerializeToString())
        else:
            request = dra_v1.NodeUnprepareResourcesRequest(claims=[_v1(c) for c in claims])
            call = dra_v1_grpc.DRAPluginStub(self.channel).NodeUnprepareResources
            answer = await self._call(method, call(request, timeout=self.call_timeout_s))
        _check_uids(method, claims, answer.claims.keys())
        return answer

    @staticmethod
    async def _call(method: str, call: Awaitable[M]) -> M:
        """Await a unary call; a gRPC error means "ignore the answer" to the kubelet."""
        try:
            return await call
        except grpc.aio.AioRpcError as exc:
            raise KubeletError(f"{method}: {exc.code().name}: {exc.details()}") from exc

    async def watch_health(
        self, *, version: Literal["v1alpha1", "v1"] = "v1alpha1"
    ) -> AsyncGenerator[health_v1alpha1.NodeWatchResourcesResponse, None]:
        """NodeWatchResources messages until the plugin ends the stream (v1 ones converted).

        A stream the plugin breaks raises KubeletError; closing the iterator cancels the call.
        """
        if version == "v1":
            advertised = self.info.supported_versions if self.info else ()
            if "v1.DRAResourceHealth" not in advertised:
                raise KubeletError("plugin does not advertise v1.DRAResourceHealth")
            call_v1 = health_v1_grpc.DRAResourceHealthStub(self.channel).NodeWatchResources(
                health_v1.NodeWatchResourcesRequest()
            )
            async for message_v1 in _stream(call_v1):
                yield _alpha(message_v1)
            return
        call = health_v1alpha1_grpc.DRAResourceHealthStub(self.channel).NodeWatchResources(
            health_v1alpha1.NodeWatchResourcesRequest()
        )
        async for message in _stream(call):
            yield message

    async def close(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:
            await channel.close()


def _identity(path: Path) -> tuple[Path, int, int]:
    """What tells a socket apart from an earlier one at the same path."""
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return (path, 0, 0)
    return (path, stat.st_ino, stat.st_ctime_ns)


def _v1(claim: KubeletClaim) -> dra_v1.Claim:
    return dra_v1.Claim(namespace=claim.namespace, name=claim.name, uid=claim.uid)


def _beta(claim: KubeletClaim) -> dra_v1beta1.Claim:
    return dra_v1beta1.Claim(namespace=claim.namespace, name=claim.name, uid=claim.uid)


async def _stream(call: grpc.aio.UnaryStreamCall[Any, M]) -> AsyncIterator[M]:
    try:
        async for message in call:
            yield message
    except grpc.aio.AioRpcError as exc:
        raise KubeletError(f"NodeWatchResources: {exc.code().name}: {exc.details()}") from exc
    finally:
        call.cancel()


def _alpha(
    message: health_v1.NodeWatchResourcesResponse,
) -> health_v1alpha1.NodeWatchResourcesResponse:
    """v1 and v1alpha1 health messages are wire-identical."""
    return health_v1alpha1.NodeWatchResourcesResponse.FromString(message.SerializeToString())


def _check_uids(method: str, claims: Sequence[KubeletClaim], answered: Iterable[str]) -> None:
    """The kubelet's checks on an answer: no unknown UID, none skipped."""
    requested = {claim.uid for claim in claims}
    answered_set = set(answered)
    unknown = sorted(answered_set - requested)
    if unknown:
        raise KubeletError(f"{method}: returned result for unknown claim UID {unknown[0]}")
    skipped = requested - answered_set
    if skipped:
        raise KubeletError(f"{method} skipped {len(skipped)} ResourceClaims")
