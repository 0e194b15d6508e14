"""The nats-py client under each bus connection: it closes each socket a failed attempt
leaves, and keeps the stored headers of what JetStream sends.

nats-py keeps one transport per client and opens every connection attempt on it. When a
reconnect attempt fails after its socket opened (the server closes at once, sends no INFO,
refuses the TLS handshake or times out), nats-py goes on to the next attempt and opens a new
socket over the old one without closing it: the old socket stays open until the garbage
collector finds it, one open file per attempt through an outage. This client drops the
previous socket before each attempt opens the next.

JetStream sends a stored message (a direct get's answer, a stream's republished copy) with the
message's own headers first and its own after them: `Nats-Stream`, `Nats-Subject`,
`Nats-Sequence`. nats-py keeps the last value of a repeated header, JetStream's, so a stored
message that itself carried these (JetStream's answer to someone's request, redirected into a
bucket) would look like a clean one. This client also keeps the first value of such a repeated
header, the stored one, under `stored:<name>` (`STORED`; no header sent on the wire has a `:` in
its name): readers judge the message as it was stored (`shared.bus.kventry.stored_headers`).
"""

from __future__ import annotations

from nats.aio.client import Client, Srv
from nats.aio.transport import TcpTransport

from shared.bus.origin import JETSTREAM_HEADERS

__all__ = ["STORED", "ClosingClient"]

STORED = "stored:"


_REPEATABLE = frozenset(name.encode() for name in JETSTREAM_HEADERS)


class ClosingClient(Client):
    @staticmethod
    def _parse_header_lines(raw: bytes) -> dict[str, str]:
        headers = Client._parse_header_lines(raw)
        if not any(raw.count(name) > 1 for name in _REPEATABLE):
            return headers  # nearly every message: no line to look at again
        first: dict[str, str] = {}
        for line in raw.split(b"\r\n"):
            name, sep, value = line.partition(b":")
            name = name.strip()
            if not sep or name not in _REPEATABLE:
                continue
            key, text = name.decode(), value.strip().decode(errors="replace")
            if key in first:
                headers.setdefault(STORED + key, first[key])
            else:
                first[key] = text
        return headers

    async def _connect_to_server(self, s: Srv) -> None:
        self.abort_socket()
        await super()._connect_to_server(s)

    def abort_socket(self) -> None:
        """Drop the socket now, without a goodbye: the bare stream under any TLS layer, so a
        TLS close waiting for a peer that never answers lets go of it too. Aborting a socket
        already closed does nothing."""
        transport = self._transport
        if isinstance(transport, TcpTransport) and transport._bare_io_writer is not None:
            transport._bare_io_writer.transport.abort()
