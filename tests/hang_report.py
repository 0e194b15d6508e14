"""A pytest plugin that shows where a hung asyncio test waits, before pytest-timeout stops it.

pytest-timeout prints the threads' stacks, and for an asyncio test the main thread only ever
waits in the selector. Shortly before the timeout this plugin finds the event loop that the
main thread runs and prints the stack of each of its tasks to stderr, which pytest shows
under the failing test.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Iterator
from typing import TextIO

import pytest

__all__ = ["pytest_runtest_call"]

# Before pytest-timeout's own limit (at most half of it), so that the report comes with the
# failure.
_MARGIN_S = 10.0


def _timeout_s(item: pytest.Item) -> float:
    """pytest-timeout's limit for `item`: its marker, else --timeout, else the ini value."""
    marker = item.get_closest_marker("timeout")
    if marker is not None and marker.args:
        return float(marker.args[0])
    return float(item.config.getoption("timeout", None) or item.config.getini("timeout") or 0)


def _running_loop_of(thread_id: int) -> asyncio.AbstractEventLoop | None:
    frame = sys._current_frames().get(thread_id)
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if frame.f_code.co_name == "_run_once" and isinstance(candidate, asyncio.AbstractEventLoop):
            return candidate
        frame = frame.f_back
    return None


def _report(nodeid: str, thread_id: int, out: TextIO) -> None:
    loop = _running_loop_of(thread_id)
    if loop is None:
        return
    lines = [f"==== {nodeid}: no progress; the stack of every asyncio task ===="]
    for task in list(asyncio.all_tasks(loop)):
        lines.append(f"--- {task!r}")
        try:
            stack = task.get_stack(limit=30)
        except Exception as exc:  # a task finishing under us: report and go on
            lines.append(f"    (stack unavailable: {exc!r})")
            continue
        lines.extend(
            f"    {frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"
            for frame in stack
        )
    print("\n".join(lines), file=out, flush=True)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    limit_s = _timeout_s(item)
    delay = limit_s - min(_MARGIN_S, limit_s / 2)
    timer = None
    if delay > 0:
        timer = threading.Timer(
            delay, _report, args=(item.nodeid, threading.get_ident(), sys.stderr)
        )
        timer.daemon = True
        timer.start()
    try:
        return (yield)
    finally:
        if timer is not None:
            timer.cancel()
