"""What a fleet worker's tasks wait on, for a fleet that stops converging: on SIGUSR1 the
worker writes to stderr (its log) how many nodes are opening which agent, and the await
chain of a few of those openings and of every other kind of task, grouped by where they
wait."""

from __future__ import annotations

import asyncio
import sys
import types
from collections import Counter
from typing import Any

__all__ = ["await_chain", "dump_tasks"]


def await_chain(task: asyncio.Task[Any]) -> list[str]:
    """`file:line function` of each coroutine the task awaits, outermost first."""
    chain: list[str] = []
    awaited: Any = task.get_coro()
    while awaited is not None:
        frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
        if frame is None:
            if isinstance(awaited, asyncio.Future):
                chain.append(f"<future {awaited!r:.120}>")
            break
        chain.append(f"{frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}")
        awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
        if isinstance(awaited, types.GeneratorType | types.CoroutineType) or awaited is None:
            continue
        if isinstance(awaited, asyncio.Future):
            chain.append(f"<future {awaited!r:.120}>")
            break
    return chain


def dump_tasks(opening: dict[str, str], *, samples: int = 3) -> None:
    """Write the worker's tasks to stderr; `opening` is node → the agent it is opening."""
    out = sys.stderr
    print(f"--- task dump: {len(opening)} nodes opening", file=out)
    for agent, count in Counter(opening.values()).most_common():
        print(f"  opening {agent}: {count}", file=out)
    by_place: dict[str, list[list[str]]] = {}
    for task in asyncio.all_tasks():
        chain = await_chain(task)
        place = chain[-1] if chain else "<no frame>"
        by_place.setdefault(place, []).append(chain)
    for place, chains in sorted(by_place.items(), key=lambda item: -len(item[1])):
        print(f"  {len(chains)} tasks waiting at {place}", file=out)
        for chain in chains[:samples]:
            for step in chain:
                print(f"      {step}", file=out)
            print("      --", file=out)
    out.flush()
