"""Plugin registration with the kubelet: the `pluginregistration.Registration` service and the
registration socket it is served on.

GetInfo tells the kubelet who we are and where the DRA socket is; NotifyRegistrationStatus
records the kubelet's verdict and, like the Go helper, answers a rejection with an error.

Unlike the Go helper, a rejection is retried from our side. The kubelet's plugin manager
records a plugin (socket path and the time its socket appeared) as registered *before* it asks
its DRA handler to register it; when that step fails it reports `plugin_registered=false` and
never tries that socket again, because its reconciler only registers sockets it has no record
of, or with a newer timestamp. A socket that appears anew has one: so after a rejection the
`Registrar` waits (jittered exponential backoff), removes the registration socket (which the
kubelet takes as a deregistration) and creates it again, until the kubelet accepts us.
Rejections before that step (validation) the kubelet retries itself; if it succeeds first, the
socket is left alone. While not registered the agent is not ready.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import grpc
import structlog

from services.allocation.kubelet import socket_server
from shared import metrics
from shared.backoff import Backoff
from shared.pb.kubelet.pluginregistration.v1 import api_pb2 as reg
from shared.pb.kubelet.pluginregistration.v1 import api_pb2_grpc as reg_grpc

__all__ = ["PLUGIN_TYPE", "SUPPORTED_VERSIONS", "Registrar", "RegistrationService"]

log = structlog.get_logger(__name__)

PLUGIN_TYPE = "DRAPlugin"
# The kubelet takes the first one it knows, in our order: v1 before v1beta1 (docs/contracts.md
# §1.2).
# Health: 1.34-1.36 kubelets know v1alpha1; 1.37 prefers v1 when both are listed.
SUPPORTED_VERSIONS = (
    "v1.DRAPlugin",
    "v1beta1.DRAPlugin",
    "v1alpha1.DRAResourceHealth",
    "v1.DRAResourceHealth",
)
# The kubelet's own retries start at 0.5 s and double up to about 2 minutes.
RETRY_INITIAL_S = 0.5
RETRY_MAX_S = 60.0
# A NotifyRegistrationStatus in flight when the socket is re-created gets this long.
_STOP_GRACE_S = 1.0

Context = grpc.aio.ServicerContext[Any, Any]

_meter = metrics.meter(__name__)
_registered_gauge = _meter.create_gauge(
    "dra_plugin_registered",
    unit="1",
    description="1 while the kubelet has the plugin registered, else 0.",
)
_rejections = _meter.create_counter(
    "dra_plugin_registration_rejections",
    unit="1",
    description="Registrations the kubelet reported as failed (NotifyRegistrationStatus false).",
)
_socket_recreations = _meter.create_counter(
    "dra_plugin_registration_retries",
    unit="1",
    description="Registration sockets re-created to make the kubelet register the plugin again.",
)


class RegistrationService(reg_grpc.RegistrationServicer):
    def __init__(self, *, driver: str, endpoint: Path) -> None:
        self._info = reg.PluginInfo(
            type=PLUGIN_TYPE,
            name=driver,
            endpoint=str(endpoint),
            supported_versions=SUPPORTED_VERSIONS,
        )
        self.status: reg.RegistrationStatus | None = None
        """The kubelet's last verdict."""
        self.registered = asyncio.Event()
        self.rejected = asyncio.Event()
        """Set by a rejection, cleared by an acceptance or when the `Registrar` retries."""
        self.acceptances = 0
        self.rejections = 0
        _registered_gauge.set(0)

    async def GetInfo(self, request: reg.InfoRequest, context: Context) -> reg.PluginInfo:
        log.info("plugin_info_requested", driver=self._info.name, endpoint=self._info.endpoint)
        return self._info

    async def NotifyRegistrationStatus(
        self, request: reg.RegistrationStatus, context: Context
    ) -> reg.RegistrationStatusResponse:
        self.status = request
        if request.plugin_registered:
            self.acceptances += 1
            self.rejected.clear()
            self.registered.set()
            _registered_gauge.set(1)
            log.info("plugin_registered", driver=self._info.name)
            return reg.RegistrationStatusResponse()
        self.rejections += 1
        self.registered.clear()
        self.rejected.set()
        _registered_gauge.set(0)
        _rejections.add(1)
        log.error("plugin_registration_rejected", driver=self._info.name, error=request.error)
        await context.abort(grpc.StatusCode.UNKNOWN, f"registration failed: {request.error}")

    def deregistered(self) -> None:
        """Our registration socket is gone: the kubelet deregisters the plugin."""
        self.registered.clear()
        _registered_gauge.set(0)

    async def not_registered(self) -> str | None:
        """Readiness check: None once the kubelet accepted the plugin, else why not."""
        if self.registered.is_set():
            return None
        if self.status is not None and not self.status.plugin_registered:
            return f"the kubelet rejected the plugin: {self.status.error}"
        return "the kubelet has not registered the plugin yet"


class Registrar:
    """Serves the registration socket at `path`; re-creates it, with backoff, after rejections.

    `open()` starts serving, `run()` (an eternal task) watches for rejections and for the
    server's own end (fatal: it returns), `close()` removes the socket (deregistration).
    """

    def __init__(
        self, service: RegistrationService, path: Path, *, backoff: Backoff | None = None
    ) -> None:
        self.service = service
        self.path = path
        self.backoff = backoff or Backoff(initial_s=RETRY_INITIAL_S, max_s=RETRY_MAX_S)
        self.retries = 0
        """Sockets re-created after rejections."""
        self._server: grpc.aio.Server | None = None
        self._recreating: asyncio.Task[None] | None = None
        self._acceptances_seen = 0

    async def open(self) -> None:
        self._server = await socket_server.start(self.path, self._add_service)

    async def close(self) -> None:
        recreating = self._recreating
        if recreating is not None:
            # Cancelled callers leave it running: it must not bind after we stopped.
            with contextlib.suppress(Exception):
                await recreating
        server, self._server = self._server, None
        if server is not None:
            await socket_server.stop(server, self.path, grace_s=_STOP_GRACE_S)
            self.service.deregistered()

    async def run(self) -> None:
        """Until the server ends on its own (returns, or raises its crash)."""
        while True:
            server = self._server
            if server is None:
                return  # closed
            terminated = asyncio.ensure_future(socket_server.until_terminated(server))
            rejected = asyncio.ensure_future(self.service.rejected.wait())
            try:
                done, _ = await asyncio.wait(
                    {terminated, rejected}, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                terminated.cancel()
                rejected.cancel()
            if terminated in done:
                terminated.result()
                return
            await self._retry()

    async def _retry(self) -> None:
        """After a rejection: wait, then re-create the socket unless accepted meanwhile."""
        if self.service.acceptances != self._acceptances_seen:
            self._acceptances_seen = self.service.acceptances
            self.backoff.reset()  # accepted since the last retry: a new series of retries
        delay = self.backoff.next_delay()
        log.warning(
            "plugin_registration_retry_scheduled",
            path=str(self.path),
            delay_s=round(delay, 3),
            rejections=self.service.rejections,
        )
        await asyncio.sleep(delay)
        if self.service.registered.is_set():
            log.info("plugin_registration_retry_skipped", reason="registered meanwhile")
            return
        self.service.rejected.clear()
        self._recreating = asyncio.create_task(self._recreate(), name="registration-socket")
        try:
            # Shielded: once the old socket is gone, the new one must come up (or fail) in
            # one piece, so that `close()` finds a server to stop.
            await asyncio.shield(self._recreating)
        finally:
            if self._recreating.done():
                self._recreating = None

    async def _recreate(self) -> None:
        old, self._server = self._server, None
        if old is not None:
            await socket_server.stop(old, self.path, grace_s=_STOP_GRACE_S)
            self.service.deregistered()
        self._server = await socket_server.start(self.path, self._add_service)
        self.retries += 1
        _socket_recreations.add(1)
        log.info("plugin_registration_socket_recreated", path=str(self.path), retry=self.retries)

    def _add_service(self, server: grpc.aio.Server) -> None:
        reg_grpc.add_RegistrationServicer_to_server(self.service, server)
