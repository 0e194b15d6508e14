"""Whether a message was sent by a client or is JetStream's own answer, redirected.

A client picks the reply subject of its requests, nats-server does not check it against the
client's permissions, and JetStream answers there itself. So an identity can have the server
publish a direct-get answer (a stored value, with `Nats-Stream`/`Nats-Subject` headers), a
consumer delivery (reply `$JS.ACK...`), a status (`Status` header) or a JSON API answer (a
publish ack `{"stream":...`, an API response `{"type":"io.nats.jetstream.api...`) on a subject
it may not publish to. None of these is ever a KV value or a control request of ours (our
values are protobuf, which never starts with `{`). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["JETSTREAM_HEADERS", "is_jetstream_reply"]

JETSTREAM_HEADERS = ("Nats-Stream", "Nats-Subject", "Nats-Sequence", "Status")
_JSON_ANSWERS = (b'{"stream":', b'{"type":"io.nats.jetstream.api.', b'{"error":')


def is_jetstream_reply(*, reply: str, headers: Mapping[str, str] | None, data: bytes) -> bool:
    """True for what JetStream sends as an answer; `reply` is the message's own reply subject."""
    if reply.startswith("$JS."):
        return True
    if headers and any(header in headers for header in JETSTREAM_HEADERS):
        return True
    return data.lstrip().startswith(_JSON_ANSWERS)
