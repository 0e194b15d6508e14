"""Hypothesis settings and strategies that the fuzz tests share.

`@given` async tests run every example on the test's event loop (pytest-asyncio), so the
function-scoped async fixtures (a running agent) serve all examples of a test: hence the
suppressed `function_scoped_fixture` health check, and examples that leave the agent as they
found it. No deadline (an example drives real sockets and a real nats-server), few examples
(each file stays within CI's budget), and no example database: nothing to replay between runs,
`print_blob` reproduces a failure instead.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, MutableMapping
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

__all__ = [
    "Logs",
    "dns_labels",
    "fuzz_settings",
    "garbage_bytes",
    "garbage_text",
    "json_values",
    "no_new_tasks",
    "running_tasks",
    "settled_tasks",
    "until",
]


def fuzz_settings(max_examples: int) -> settings:
    return settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        print_blob=True,
    )


def dns_labels(max_size: int = 12) -> st.SearchStrategy[str]:
    """Valid Kubernetes names (DNS-1123 labels)."""
    return st.from_regex(rf"[a-z0-9]([-a-z0-9]{{0,{max_size - 2}}}[a-z0-9])?", fullmatch=True)


def garbage_text(max_size: int = 40) -> st.SearchStrategy[str]:
    """Any text, with the strings that break paths, parsers and logs made likely."""
    tricky = st.sampled_from(
        ["", " ", "..", "../..", "a/b", "%2F", "x?watch=1", "\x00", "ü", "A" * 300, "a\n", "-"]
    )
    return tricky | st.text(max_size=max_size)


def garbage_bytes(max_size: int = 512) -> st.SearchStrategy[bytes]:
    return st.binary(max_size=max_size) | st.sampled_from([b"", b"\x00", b"\xff" * 64, b"{}"])


def json_values(max_leaves: int = 6) -> st.SearchStrategy[Any]:
    """Any JSON document (numbers within what both JSON codecs and the API emulator keep)."""
    scalars = (
        st.none()
        | st.booleans()
        | st.integers(min_value=-(2**53), max_value=2**53)
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(max_size=12)
    )
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
        max_leaves=max_leaves,
    )


async def until(check: Callable[[], bool], *, timeout_s: float = 10.0, what: str = "") -> None:
    """Poll `check` until it holds; AssertionError naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s}s: {what or check}")
        await asyncio.sleep(0.02)


def running_tasks() -> set[asyncio.Task[Any]]:
    """The loop's tasks less the caller's and the API emulator's per-connection HTTP handlers
    (test infrastructure: their number follows the agent's kube connection pool)."""
    current = asyncio.current_task()
    return {
        task
        for task in asyncio.all_tasks()
        if task is not current
        and getattr(task.get_coro(), "__qualname__", "") != "RequestHandler.start"
    }


async def settled_tasks(*, quiet_s: float = 0.2) -> set[asyncio.Task[Any]]:
    """`running_tasks()` once their number stopped changing for `quiet_s`."""
    tasks = running_tasks()
    while True:
        await asyncio.sleep(quiet_s)
        now = running_tasks()
        if len(now) == len(tasks):
            return now
        tasks = now


async def no_new_tasks(baseline: set[asyncio.Task[Any]], *, timeout_s: float = 5.0) -> None:
    """Wait until no more tasks run than in `baseline`; name the extra ones if that fails."""
    deadline = time.monotonic() + timeout_s
    while len(running_tasks()) > len(baseline):
        if time.monotonic() > deadline:
            extra = sorted(str(task.get_coro()) for task in running_tasks() - baseline)
            raise AssertionError(f"tasks left over: {extra}")
        await asyncio.sleep(0.02)


class Logs:
    """The captured log events, and a way to wait for the next one of some names."""

    def __init__(self, events: list[MutableMapping[str, Any]]) -> None:
        self.events = events

    def mark(self) -> int:
        return len(self.events)

    def since(self, mark: int, *names: str) -> list[MutableMapping[str, Any]]:
        return [e for e in self.events[mark:] if e.get("event") in names]

    async def next(
        self, mark: int, *names: str, timeout_s: float = 10.0
    ) -> MutableMapping[str, Any]:
        """The first event named one of `names` logged after `mark`."""
        await until(lambda: bool(self.since(mark, *names)), timeout_s=timeout_s, what=str(names))
        return self.since(mark, *names)[0]
