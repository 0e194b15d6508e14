"""Certifying the agents' writer keys: the answer to `dra.auth.certify.<role>.<node>`.

Every agent process makes an ed25519 writer key and, before its first signed write, asks here
for a certificate (`shared.bus.signing`). Only the identity `<role>@<node>` may publish that
subject (`permissions`), so the subject names who asks; the body names the key, and a proof
signed with it shows the sender holds it. The answer is a certificate (node, role, key,
not_before, not_after) signed with the auth key (`--certify-seed-file`, `certify.seed` of the
callout Secret), valid for `--certificate-s`.

The auth service's own user lives in account AUTH and the agents in the app account, so, as the
provisioner does, it connects a second time with a random token only this process knows; its
own callout admits that connection as `certifier` (hear the certify subjects in a queue group,
answer each request once, nothing else). A message that JetStream sent (a consumer delivery or
a direct-get answer redirected onto the subject through someone's reply subject) never reaches
the handler (`Bus.subscribe`), and a request with no reply subject of a client gets no answer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import json
import secrets
import time
from collections.abc import Callable

import structlog
from nats.aio.msg import Msg

from services.natsauth.keys import SigningKey
from services.natsauth.permissions import CERTIFIER
from shared.bus import signing
from shared.bus.connection import Bus
from shared.bus.subjects import Writer
from shared.config import NATSSettings
from shared.errors import BusUnavailableError

__all__ = ["CERTIFY_QUEUE", "Certifier", "answer"]

log = structlog.get_logger(__name__)
CERTIFY_QUEUE = "dra-nats-auth-certify"


def answer(
    subject_writer: Writer | None,
    body: bytes,
    proof: str,
    *,
    signer: signing.Signer,
    lifetime_s: int,
    now: float,
) -> tuple[dict[str, str], signing.Certificate | None]:
    """The JSON answer to one certify request, and the certificate issued (None: refused)."""
    if subject_writer is None:
        return {"error": "not a certify subject"}, None
    try:
        request = signing.read_certify_request(body, proof, subject_writer=subject_writer, now=now)
    except signing.Rejected as exc:
        return {"error": f"refused: {exc.reason}"}, None
    cert = signing.Certificate(
        node=request.node, role=request.role, key=request.key,
        not_before=int(now) - 60, not_after=int(now) + lifetime_s,
    )  # fmt: skip
    return {"certificate": signing.issue_certificate(cert, auth=signer)}, cert


class Certifier:
    def __init__(
        self,
        settings: NATSSettings,
        *,
        signer: SigningKey,
        lifetime_s: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.token = secrets.token_urlsafe(32)
        self.settings = dataclasses.replace(
            settings, user="", password="", password_file="", token=self.token, token_file="",
            nkey_seed_file="", creds_file="",
        )  # fmt: skip
        self.signer = signer
        self.lifetime_s = lifetime_s
        self.clock = clock
        self.serving = asyncio.Event()
        self.bus = Bus(self.settings, name="dra-nats-auth-certifier", component=CERTIFIER)

    def admits(self, token: str) -> bool:
        """The token is this process's own certifying token."""
        return hmac.compare_digest(token.encode(), self.token.encode())

    async def run(self) -> None:
        """Eternal: keep the certifier connection and its queue subscription."""
        connector = asyncio.create_task(self.bus.run(), name="certifier-connector")
        try:
            while True:
                await self.bus.connected.wait()
                try:
                    # nats-py subscribes again by itself after a reconnect: once is enough.
                    await self.bus.subscribe(
                        self.bus.names.certify_wildcard, self.handle, queue=CERTIFY_QUEUE
                    )
                except BusUnavailableError:
                    await asyncio.sleep(0.5)
                    continue
                self.serving.set()
                log.info("bus_certifier_serving", subject=self.bus.names.certify_wildcard)
                await connector
        finally:
            await self.bus.close()
            connector.cancel()
            await asyncio.gather(connector, return_exceptions=True)

    async def handle(self, msg: Msg) -> None:
        if not msg.reply or msg.reply.startswith("$"):
            return  # nobody to answer, or a JetStream subject
        proof = (msg.headers or {}).get(signing.PROOF_HEADER, "")
        who = self.bus.names.certifier_of(msg.subject)
        body, cert = answer(
            who, msg.data, proof, signer=self.signer, lifetime_s=self.lifetime_s,
            now=self.clock(),
        )  # fmt: skip
        if cert is None:
            log.warning("bus_certify_refused", subject=msg.subject, error=body["error"],
                        security=True)  # fmt: skip
        else:
            log.info("bus_key_certified", role=cert.role, node=cert.node,
                     not_after=cert.not_after)  # fmt: skip
        await msg.respond(json.dumps(body).encode())
