"""A first connect that stopped moving: nats-py's own loop can wait forever in it.

With TLS handshake-first, a handshake that runs past the connect timeout (a server too busy
to answer, as at a fleet's start) is cancelled inside asyncio's `start_tls`, which closes the
socket through the TLS protocol it installed. nats-py then closes the stream writer it held
from before the handshake and waits for that writer's protocol to see the close, which never
comes: the connect waits forever, and the agent never joins the bus.

Every failed step of the connect loop reports its error (`mark` is called from the error
callback), and each step is bounded by the connect timeout. So an attempt with no report
for longer than its steps could take has stopped, and is given up for a new one.
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["ConnectProgress", "ConnectStalledError"]

_STEPS = 4
"""Steps of one try that nats-py bounds by the connect timeout: TCP, TLS, INFO, PONG."""
_SLACK_S = 2.0
"""The wait between tries and a loaded event loop's delays."""


class ConnectStalledError(Exception):
    """A connect attempt made no progress for longer than one try can take."""


class ConnectProgress:
    """When a connect attempt last moved: started, or failed one try and went on."""

    def __init__(self, *, connect_timeout_s: float) -> None:
        self.stall_s = _STEPS * connect_timeout_s + _SLACK_S
        self._last = 0.0

    def mark(self) -> None:
        self._last = asyncio.get_running_loop().time()

    async def wait(self, attempt: asyncio.Future[Any]) -> None:
        """Wait for `attempt` to finish; raise ConnectStalledError once it stops moving (the
        caller gives it up). The attempt's own result or error is left to the caller."""
        loop = asyncio.get_running_loop()
        self.mark()
        while not attempt.done():
            idle = loop.time() - self._last
            if idle >= self.stall_s:
                raise ConnectStalledError(
                    f"nats connect made no progress for {idle:.1f}s (a TLS handshake that"
                    " timed out can leave it waiting for ever); starting a new attempt"
                )
            # Through `wait`: a stop reaches this task at once (see Bus._connect_once).
            await asyncio.wait({attempt}, timeout=self.stall_s - idle)
