"""A Bus's side of signed records: its writer key, and the one check every reader goes through.

`Records.check` is where the Bus decides about an entry (a KV watch delivery, a direct get, an
alert): with `--bus-signatures off` it takes everything as before; otherwise it verifies with
`shared.bus.signing` against the owner `Names.writer_of` names for the subject. A record it
refuses is logged (`security=true`) and counted in `dra_bus_records_rejected_total{reason}`;
an unsigned one taken in accept mode is counted in `dra_bus_records_unsigned_total`.

`Records.sign` adds this process's certificate and signature to what it writes, and
`Records.msg_id` turns an alert's deterministic ID into a JetStream message ID another node
cannot claim first: an HMAC of it under a secret of this process, after this node's token.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import structlog

from shared import metrics, signature_settings
from shared.bus import signing
from shared.bus.subjects import Names, token
from shared.config import NATSSettings

__all__ = ["Check", "Records"]

log = structlog.get_logger(__name__)
_meter = metrics.meter(__name__)
REJECTED = _meter.create_counter(
    "dra_bus_records_rejected",
    unit="1",
    description="Bus records (KV entries, alerts) dropped because their writer did not prove "
    "itself, by reason (unsigned, empty, malformed, bad_certificate, expired_certificate, "
    "bad_signature, wrong_owner).",
)
UNSIGNED = _meter.create_counter(
    "dra_bus_records_unsigned",
    unit="1",
    description="Unsigned bus records taken in --bus-signatures accept mode (a writer not "
    "upgraded yet); 0 everywhere before switching to enforce.",
)
# At 0 from the start: `increase()` in the shipped alert sees a first rejection as a rise.
metrics.export_at_zero(REJECTED, *({"reason": reason} for reason in signing.REASONS))
metrics.export_at_zero(UNSIGNED)


@dataclass(frozen=True, slots=True)
class Check:
    ok: bool
    reason: str = ""
    """Why not, from `signing.REASONS`; empty when taken."""
    writer: signing.Certificate | None = None
    """The signer's certificate; None for a record taken unsigned (accept) or with checks off."""


_TAKEN = Check(ok=True)


class Records:
    def __init__(
        self,
        settings: NATSSettings,
        *,
        names: Names,
        role: str,
        node: str,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.mode = settings.bus_signatures
        self.names = names
        self.role = role
        self.node = node
        self.clock = clock
        auth_key = settings.auth_key()
        self.verifier = signing.Verifier(auth_key) if auth_key is not None else None
        self.auth_key = auth_key
        signs = (
            self.mode != signature_settings.OFF and role in signing.CERTIFIED_ROLES and bool(node)
        )
        self.writer = signing.WriterKey() if signs else None
        self._dedup_secret = os.urandom(32)
        self._resigned: set[str] = set()

    @property
    def on(self) -> bool:
        return self.verifier is not None

    def check(
        self,
        subject: str,
        data: bytes,
        headers: Mapping[str, str] | None,
        *,
        stored_at: float | None = None,
        event: str = "kv_entry_dropped",
    ) -> Check:
        """Whether a reader may take the record on `subject`; a refusal is logged as `event`."""
        if self.verifier is None:
            return _TAKEN
        found = headers or {}
        when = stored_at if stored_at is not None else self.clock()
        owner = self.names.writer_of(subject)
        try:
            cert = self.verifier.verify(subject, data, found, owner=owner, stored_at=when)
        except signing.Rejected as exc:
            if exc.reason == "unsigned" and self.mode == signature_settings.ACCEPT:
                UNSIGNED.add(1)
                return _TAKEN
            REJECTED.add(1, {"reason": exc.reason})
            log.warning(event, subject=subject, reason=exc.reason, detail=exc.detail,
                        security=True)  # fmt: skip
            return Check(ok=False, reason=exc.reason)
        return Check(ok=True, writer=cert)

    def owns(self, subject: str) -> bool:
        """This process writes `subject` (its own key or alert subject)."""
        return self.writer is not None and self.names.writer_of(subject) == (
            self.role,
            token(self.node),
        )

    def resign(self, subject: str) -> bool:
        """Whether to sign again an unsigned record taken on our own `subject` (accept mode:
        written before this agent signed). Once per subject and process, so that an older
        writer of the same key still running during a rollout cannot start a ping-pong."""
        if not self.owns(subject) or subject in self._resigned:
            return False
        self._resigned.add(subject)
        return True

    def sign(self, subject: str, data: bytes, headers: Mapping[str, str]) -> dict[str, str]:
        """`headers` with this process's certificate and signature; as they are when it does
        not sign (signatures off, or a Bus of no node agent)."""
        if self.writer is None:
            return dict(headers)
        return self.writer.headers(subject, data, headers)

    def msg_id(self, msg_id: str) -> str:
        """The JetStream message ID for `msg_id`: itself with signatures off; else one no other
        node can compute (a retry of this process still deduplicates)."""
        if self.writer is None or not msg_id:
            return msg_id
        digest = hmac.new(self._dedup_secret, msg_id.encode(), hashlib.sha256).hexdigest()
        return f"{token(self.node)}.{digest[:40]}"

    def certify_request(self) -> tuple[str, bytes, dict[str, str]]:
        """Subject, body and headers of this process's certify request."""
        assert self.writer is not None
        body, proof = signing.certify_request(
            self.writer, role=self.role, node=self.node, now=self.clock()
        )
        return self.names.certify(self.role, self.node), body, {signing.PROOF_HEADER: proof}

    def install(self, certificate: str) -> signing.Certificate:
        """Take the auth service's certificate for our key; raises `signing.Rejected`."""
        assert self.writer is not None
        assert self.auth_key is not None
        return self.writer.install(
            certificate, auth_key=self.auth_key, role=self.role, node=self.node, now=self.clock()
        )
