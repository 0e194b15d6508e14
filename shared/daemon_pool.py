"""A thread pool whose threads never hold the process up at exit: the agents' blocking work.

`asyncio.to_thread` and `run_in_executor` run on the loop's default executor. A
ThreadPoolExecutor's threads are joined when the loop closes (`asyncio.run`) and again when
the interpreter exits, so one call stuck in a syscall (a write or fsync on a full or failing
disk, a flock held by a stuck sibling) kept a stopped agent alive until the kubelet killed it:
SIGTERM seemed ignored. Cancelling the awaiting task cannot stop the thread. Here the threads
are daemons and `shutdown(wait=True)` waits at most `exit_wait_s`; a call still running then
is abandoned, as a kill would abandon it. Only work that is crash-safe may run here, which is
all the agents' file work (atomic replace, fsync before answering).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import structlog

__all__ = ["DaemonThreadPool"]

log = structlog.get_logger(__name__)

T = TypeVar("T")
_Work = tuple[concurrent.futures.Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class DaemonThreadPool(concurrent.futures.ThreadPoolExecutor):
    """Up to `max_workers` daemon threads, started as work arrives and kept while idle.

    A ThreadPoolExecutor only by type (asyncio's default executor must be one): none of its
    threads or queues are used, so its exit hook has nothing of ours to join.
    """

    def __init__(
        self, *, max_workers: int, thread_name_prefix: str, exit_wait_s: float = 1.0
    ) -> None:
        super().__init__(max_workers=max_workers, thread_name_prefix=thread_name_prefix)
        self._exit_wait_s = exit_wait_s
        self._queue: queue.SimpleQueue[_Work | None] = queue.SimpleQueue()
        self._daemons: list[threading.Thread] = []
        self._idle_daemons = threading.Semaphore(0)
        self._submit_lock = threading.Lock()
        self._closed = False

    def submit(
        self, fn: Callable[..., T], /, *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future[T]:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._submit_lock:
            if self._closed:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._queue.put((future, fn, args, kwargs))
            idle = self._idle_daemons.acquire(blocking=False)
            if not idle and len(self._daemons) < self._max_workers:
                thread = threading.Thread(
                    target=self._serve,
                    name=f"{self._thread_name_prefix}_{len(self._daemons)}",
                    daemon=True,
                )
                thread.start()
                self._daemons.append(thread)
        return future

    def _serve(self) -> None:
        while (item := self._queue.get()) is not None:
            future, fn, args, kwargs = item
            del item
            if future.set_running_or_notify_cancel():
                try:
                    result = fn(*args, **kwargs)
                except BaseException as exc:  # handed to the caller, whatever it is
                    future.set_exception(exc)
                else:
                    future.set_result(result)
            del future, fn, args, kwargs
            self._idle_daemons.release()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop taking work; with `wait`, give calls in flight `exit_wait_s` to finish."""
        with self._submit_lock:
            self._closed = True
            threads = list(self._daemons)
        if cancel_futures:
            with contextlib.suppress(queue.Empty):
                while (item := self._queue.get_nowait()) is not None:
                    item[0].cancel()
        for _ in threads:
            self._queue.put(None)
        if not wait:
            return
        deadline = time.monotonic() + self._exit_wait_s
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        stuck = [thread.name for thread in threads if thread.is_alive()]
        if stuck:
            log.warning("blocking_calls_abandoned", threads=stuck)
