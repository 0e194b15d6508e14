"""The one component that makes the bus's streams: the auth service, before any agent needs them.

The auth service's own user lives in account AUTH; the streams live in the app account. So it
connects a second time with a random token only this process knows; its own callout admits that
connection as `provisioner` (stream info, create and update of the bus's streams, nothing
else) for a few minutes. It creates every bucket and the alert stream as `shared.bus.streams`
says and brings drifted ones back (`shared.bus.convergence`), then disconnects; again after
every reconnect of its own connection (a restarted server may have lost its store). Agents may
not create or update streams, and refuse to use one that differs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import secrets

import structlog

from services.natsauth.permissions import PROVISIONER
from shared.backoff import Backoff
from shared.bus import convergence, streams
from shared.bus.connection import Bus
from shared.bus.streams import StreamTamperedError
from shared.cancellation import reraise_if_cancelling
from shared.config import NATSSettings
from shared.errors import BusUnavailableError

__all__ = ["LEASE_S", "Provisioner"]

log = structlog.get_logger(__name__)

LEASE_S = 300
"""How long the provisioner's user JWT lives: it disconnects long before."""


class Provisioner:
    def __init__(self, settings: NATSSettings) -> None:
        self.token = secrets.token_urlsafe(32)
        self.settings = dataclasses.replace(
            settings, user="", password="", password_file="", token=self.token, token_file="",
            nkey_seed_file="", creds_file="",
        )  # fmt: skip
        self.done = asyncio.Event()

    def admits(self, token: str) -> bool:
        """The token is this process's own provisioning token."""
        return hmac.compare_digest(token.encode(), self.token.encode())

    async def run(self, own: Bus) -> None:
        """Eternal: provision once `own` (the callout's connection) is up, and after each
        reconnect of it."""
        backoff = Backoff(initial_s=0.5, max_s=30.0)
        while True:
            await own.connected.wait()
            epoch = own.epoch
            try:
                await self.provision()
            except BusUnavailableError as exc:
                reraise_if_cancelling()
                delay = backoff.next_delay()
                log.warning("streams_not_provisioned", error=str(exc), retry_in_s=round(delay, 2))
                await asyncio.sleep(delay)
                continue
            backoff.reset()
            await own.wait_epoch_after(epoch)

    async def provision(self) -> None:
        """Create or bring back every stream; a stream NATS cannot bring back is logged (the
        agents will refuse it) and the others are still provisioned."""
        bus = Bus(self.settings, name="dra-nats-auth-provisioner", component=PROVISIONER)
        task = asyncio.create_task(bus.run(), name="provisioner-connector")
        try:
            await asyncio.wait_for(bus.connected.wait(), self.settings.connect_timeout_s * 5)
            tampered = []
            for config in streams.all_streams(bus.names, replicas=self.settings.replicas):
                try:
                    await convergence.ensure(
                        bus.nc, config, timeout_s=self.settings.request_timeout_s, reported=set()
                    )
                except StreamTamperedError as exc:
                    tampered.append(exc.stream)
            log.info("streams_provisioned", tampered=tampered)
            if not tampered:
                self.done.set()
        except TimeoutError as exc:
            raise BusUnavailableError("provisioner could not connect") from exc
        finally:
            await bus.close()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
