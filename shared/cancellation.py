"""Guard against cancellations lost inside third-party awaits.

On Python 3.11, `asyncio.wait_for` (used inside nats-py's connect, request and publish) can
swallow a cancellation that arrives together with the result. Call `reraise_if_cancelling()`
right after such an await in a loop, so that a stop request is never lost.
"""

from __future__ import annotations

import asyncio

__all__ = ["reraise_if_cancelling"]


def reraise_if_cancelling() -> None:
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
