"""The claims of one kubelet call, worked through with a bounded number in flight.

A call may name any number of claims (30,000 took an unbounded agent past 1 GB). At most
`MAX_IN_FLIGHT` run at once, so the GETs, coroutines and buffers alive at any moment do not
grow with the call; a claim's error is kept without its traceback, whose frames would hold
every finished claim's objects until the call ends. Any other exception is a bug, kept whole
for the caller to raise.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from shared.errors import ClaimError

__all__ = ["MAX_IN_FLIGHT", "run"]

Item = TypeVar("Item")
Outcome = TypeVar("Outcome")

MAX_IN_FLIGHT = 32
"""Claims of one call worked on at once: enough to overlap GETs and fsyncs (group commit)."""


async def run(
    items: Sequence[Item],
    step: Callable[[Item], Awaitable[Outcome]],
    *,
    in_flight: int = MAX_IN_FLIGHT,
) -> list[Outcome | Exception]:
    """`step` of each item, at most `in_flight` at once; outcomes in the order of `items`."""
    outcomes: dict[int, Outcome | Exception] = {}
    pending = iter(enumerate(items))

    async def worker() -> None:
        for index, item in pending:
            try:
                outcomes[index] = await step(item)
            except ClaimError as exc:
                outcomes[index] = _without_frames(exc)
            except Exception as exc:  # a bug: kept whole, for the caller to raise
                outcomes[index] = exc

    await asyncio.gather(*(worker() for _ in range(min(in_flight, len(items)))))
    return [outcomes[index] for index in range(len(items))]


def _without_frames(exc: ClaimError) -> ClaimError:
    """`exc` with no traceback in it or its causes: its message is all an answer needs."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        current.__traceback__ = None
        current = current.__cause__ or current.__context__
    return exc
