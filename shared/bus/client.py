"""The nats-py client under each bus connection, closing each socket a failed attempt leaves.

nats-py keeps one transport per client and opens every connection attempt on it. When a
reconnect attempt fails after its socket opened (the server closes at once, sends no INFO,
refuses the TLS handshake or times out), nats-py goes on to the next attempt and opens a new
socket over the old one without closing it: the old socket stays open until the garbage
collector finds it, one open file per attempt through an outage. This client drops the
previous socket before each attempt opens the next.
"""

from __future__ import annotations

from nats.aio.client import Client, Srv
from nats.aio.transport import TcpTransport

__all__ = ["ClosingClient"]


class ClosingClient(Client):
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
