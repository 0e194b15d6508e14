"""Writer keys certified in process, by an auth key held here, as `dra-nats-auth` certifies an
agent's key over the bus: for benches and tests that write signed records without running the
auth service. The certificate is the real one (`signing.issue_certificate`), and the writer
takes it through the same checks as an agent does (`WriterKey.install`)."""

from __future__ import annotations

from services.natsauth.keys import SigningKey
from shared import signature_settings
from shared.bus import signing

__all__ = ["certified_writer"]


def certified_writer(
    auth: SigningKey,
    *,
    role: str,
    node: str,
    now: float,
    lifetime_s: int = 3600,
    backdated_s: int = 60,
    writer: signing.WriterKey | None = None,
) -> signing.WriterKey:
    """`writer` (a new key unless given), certified for `role` on `node` from
    `now - backdated_s` to `now + lifetime_s`."""
    writer = writer if writer is not None else signing.WriterKey()
    cert = signing.Certificate(
        node=node,
        role=role,
        key=writer.public,
        not_before=int(now) - backdated_s,
        not_after=int(now) + lifetime_s,
    )
    writer.install(
        signing.issue_certificate(cert, auth=auth),
        auth_key=signature_settings.decode_auth_key(auth.public),
        role=role,
        node=node,
        now=now,
    )
    return writer
