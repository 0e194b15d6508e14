"""Streaming a watch: newline-delimited `{"type", "object"}` events over a chunked response.

Starts from the current state (resourceVersion "" or "0": synthetic ADDED events)
or from the kept history (older than the history: one ERROR event with a 410
Status). Selector changes turn MODIFIED into ADDED/DELETED, as kube's watch cache does.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from devcluster.apiserver import errors
from devcluster.apiserver.conversion import view
from devcluster.apiserver.query import Selection, matching
from devcluster.apiserver.registry import ResourceType
from devcluster.apiserver.store import Event, GoneError, Store, Watcher

__all__ = ["WatchOptions", "stream"]


@dataclass(frozen=True, slots=True, kw_only=True)
class WatchOptions:
    resource_version: str = ""
    bookmarks: bool = False
    send_initial_events: bool = False
    timeout_s: float | None = None
    bookmark_interval_s: float = 1.0
    cut_after_s: float | None = None
    """Injected fault: end the stream after this long."""


def _line(event_type: str, obj: dict[str, Any]) -> bytes:
    return json.dumps({"type": event_type, "object": obj}, separators=(",", ":")).encode() + b"\n"


def _translate(
    event: Event, rt: ResourceType, selection: Selection
) -> tuple[str, dict[str, Any]] | None:
    shown = view(event.obj, rt)
    now_in = selection.matches(shown)
    was_in = event.prev is not None and selection.matches(view(event.prev, rt))
    if event.type == "DELETED":
        return ("DELETED", shown) if (was_in or now_in) else None
    if now_in:
        return ("MODIFIED" if was_in else "ADDED", shown)
    return ("DELETED", shown) if was_in else None


def _bookmark(rt: ResourceType, rv: int, *, initial_end: bool = False) -> bytes:
    meta: dict[str, Any] = {"resourceVersion": str(rv)}
    if initial_end:
        meta["annotations"] = {"k8s.io/initial-events-end": "true"}
    return _line("BOOKMARK", {"kind": rt.kind, "apiVersion": rt.api_version, "metadata": meta})


def _start(
    store: Store, rt: ResourceType, selection: Selection, options: WatchOptions
) -> tuple[list[bytes], Watcher]:
    """Initial lines and the subscription, taken together with no await in between."""
    rv = options.resource_version

    def shown(event: Event) -> bool:
        return _translate(event, rt, selection) is not None

    if rv in ("", "0") or options.send_initial_events:
        lines = [_line("ADDED", obj) for obj in matching(store, rt, selection)]
        if options.send_initial_events and options.bookmarks:
            lines.append(_bookmark(rt, store.rv, initial_end=True))
        return lines, store.subscribe(rt.storage, shown)
    if not rv.isdigit():
        raise errors.bad_request(f"invalid resource version: {rv!r}")
    backlog, watcher = store.watch(rt.storage, int(rv), shown)
    translated = (_translate(e, rt, selection) for e in backlog)
    return [_line(t, o) for t, o in filter(None, translated)], watcher


async def stream(
    request: web.Request, *, store: Store, rt: ResourceType, selection: Selection,
    options: WatchOptions,
) -> web.StreamResponse:  # fmt: skip
    try:
        lines, watcher = _start(store, rt, selection, options)
    except GoneError as exc:
        lines, watcher = [_line("ERROR", errors.APIError(410, "Expired", str(exc)).status())], None
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    response.enable_chunked_encoding()
    await response.prepare(request)
    try:
        for line in lines:
            await response.write(line)
        if watcher is not None:
            await _pump(response, watcher, store=store, rt=rt, selection=selection, options=options)
        await response.write_eof()
    except ConnectionResetError:
        pass  # the client went away; nothing left to tell it
    finally:
        if watcher is not None:
            store.unwatch(watcher)
    return response


async def _pump(
    response: web.StreamResponse, watcher: Watcher, *, store: Store, rt: ResourceType,
    selection: Selection, options: WatchOptions,
) -> None:  # fmt: skip
    limits = [t for t in (options.timeout_s, options.cut_after_s) if t is not None]
    deadline = time.monotonic() + min(limits) if limits else None
    next_bookmark = time.monotonic() + options.bookmark_interval_s
    while True:
        wait = next_bookmark - time.monotonic() if options.bookmarks else None
        if deadline is not None:
            left = deadline - time.monotonic()
            wait = left if wait is None else min(wait, left)
        try:
            event = await asyncio.wait_for(
                watcher.queue.get(), timeout=max(wait, 0) if wait is not None else None
            )
        except TimeoutError:
            if deadline is not None and time.monotonic() >= deadline:
                return
            if watcher.queue.empty():  # every event up to store.rv has been sent
                await response.write(_bookmark(rt, store.rv))
            next_bookmark = time.monotonic() + options.bookmark_interval_s
            continue
        if event is None:
            return
        translated = _translate(event, rt, selection)
        if translated is not None:
            await response.write(_line(*translated))
