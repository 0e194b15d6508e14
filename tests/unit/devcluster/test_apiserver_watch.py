"""Watch streams of the API server emulator: events, resume, 410 Gone, bookmarks, cut streams."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from devcluster.apiserver import APIServerEmulator, ClusterConfig
from devcluster.apiserver.store import Store

SLICES = "/apis/resource.k8s.io/v1/resourceslices"


async def _events(response: aiohttp.ClientResponse, count: int) -> list[dict[str, Any]]:
    events = []
    for _ in range(count):
        line = await asyncio.wait_for(response.content.readline(), 5)
        assert line, "stream ended early"
        events.append(json.loads(line))
    return events


def _config(**overrides: Any) -> ClusterConfig:
    return dataclasses.replace(ClusterConfig.for_tests(), **overrides)


async def _drain(list_call: Callable[..., Any], **kwargs: Any) -> None:
    async with watch.Watch() as w:
        async for _ in w.stream(list_call, timeout_seconds=2, **kwargs):
            pass


async def test_watch_from_now_lists_existing_objects_then_streams_changes(
    http, apiserver, slice_factory
):
    apiserver.create_object(slice_factory("old"))
    async with http.get(SLICES, params={"watch": "true"}) as response:
        assert response.status == 200
        [initial] = await _events(response, 1)
        created = apiserver.create_object(slice_factory("new"))
        created["spec"]["pool"]["generation"] = 2
        apiserver.update_object(created)
        apiserver.delete_object("resourceslices", "new")
        events = await _events(response, 3)
    assert (initial["type"], initial["object"]["metadata"]["name"]) == ("ADDED", "old")
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "new"), ("MODIFIED", "new"), ("DELETED", "new"),
    ]  # fmt: skip
    versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert versions == sorted(versions)
    assert events[1]["object"]["spec"]["pool"]["generation"] == 2


async def test_watch_from_resource_version_replays_only_later_events(
    http, apiserver, slice_factory
):
    first = apiserver.create_object(slice_factory("a"))
    apiserver.create_object(slice_factory("b"))
    params = {"watch": "1", "resourceVersion": first["metadata"]["resourceVersion"]}
    async with http.get(SLICES, params=params) as response:
        [event] = await _events(response, 1)
    assert (event["type"], event["object"]["metadata"]["name"]) == ("ADDED", "b")


async def test_watch_from_compacted_resource_version_gets_410_error_event(slice_factory):
    async with APIServerEmulator(_config(watch_history=3)) as server:
        first = server.create_object(slice_factory("s0"))
        for i in range(1, 6):
            server.create_object(slice_factory(f"s{i}"))
        params = {"watch": "true", "resourceVersion": first["metadata"]["resourceVersion"]}
        async with (
            aiohttp.ClientSession(base_url=server.url) as http,
            http.get(SLICES, params=params) as response,
        ):
            [event] = await _events(response, 1)
            assert await response.content.readline() == b""
    assert event["type"] == "ERROR"
    assert event["object"]["kind"] == "Status"
    assert event["object"]["code"] == 410
    assert "too old resource version" in event["object"]["message"]


async def test_kubernetes_asyncio_watch_sees_created_slices(kube, apiserver, slice_factory):
    api = client.ResourceV1Api(kube)
    seen: list[tuple[str, str]] = []

    async def writer() -> None:
        await asyncio.sleep(0.05)
        await api.create_resource_slice(body=slice_factory("w1"))
        await api.delete_resource_slice("w1")

    task = asyncio.create_task(writer())
    async with watch.Watch() as w:
        async for event in w.stream(api.list_resource_slice, timeout_seconds=5):
            seen.append((event["type"], event["object"].metadata.name))
            if len(seen) == 2:
                w.stop()
    await task
    assert seen == [("ADDED", "w1"), ("DELETED", "w1")]


async def test_kubernetes_asyncio_watch_raises_410_for_too_old_version(slice_factory):
    async with APIServerEmulator(_config(watch_history=2)) as server:
        for i in range(5):
            server.create_object(slice_factory(f"s{i}"))
        configuration = client.Configuration(host=server.url)
        async with client.ApiClient(configuration) as api:
            resource_api = client.ResourceV1Api(api)
            with pytest.raises(ApiException) as caught:
                await _drain(resource_api.list_resource_slice, resource_version="2")
    assert caught.value.status == 410


async def test_label_change_out_of_selection_is_seen_as_deleted(http, apiserver, slice_factory):
    created = apiserver.create_object(slice_factory("s"))
    async with http.get(
        SLICES, params={"watch": "true", "labelSelector": "driver=gpu"}
    ) as response:
        await _events(response, 1)
        created["metadata"]["labels"] = {"driver": "other"}
        apiserver.update_object(created)
        [event] = await _events(response, 1)
    assert event["type"] == "DELETED"


async def test_field_selected_watch_ignores_other_nodes(http, apiserver, slice_factory):
    params = {"watch": "true", "fieldSelector": "spec.nodeName=node-2"}
    async with http.get(SLICES, params=params) as response:
        apiserver.create_object(slice_factory("a", node="node-1"))
        apiserver.create_object(slice_factory("b", node="node-2"))
        [event] = await _events(response, 1)
    assert event["object"]["metadata"]["name"] == "b"


async def test_bookmarks_carry_the_current_resource_version(slice_factory):
    async with APIServerEmulator(_config(bookmark_interval_s=0.05)) as server:
        created = server.create_object(slice_factory("s"))
        params = {
            "watch": "true",
            "allowWatchBookmarks": "true",
            "resourceVersion": created["metadata"]["resourceVersion"],
        }
        async with (
            aiohttp.ClientSession(base_url=server.url) as http,
            http.get(SLICES, params=params) as response,
        ):
            [event] = await _events(response, 1)
    assert event["type"] == "BOOKMARK"
    assert event["object"]["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
    assert event["object"]["kind"] == "ResourceSlice"


async def test_send_initial_events_ends_with_marked_bookmark(http, apiserver, slice_factory):
    apiserver.create_object(slice_factory("s"))
    params = {
        "watch": "true", "sendInitialEvents": "true", "allowWatchBookmarks": "true",
        "resourceVersionMatch": "NotOlderThan",
    }  # fmt: skip
    async with http.get(SLICES, params=params) as response:
        added, bookmark = await _events(response, 2)
    assert added["type"] == "ADDED"
    assert bookmark["type"] == "BOOKMARK"
    assert bookmark["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}


async def test_timeout_seconds_ends_the_stream(http):
    params = {"watch": "true", "timeoutSeconds": "0.1"}
    async with http.get(SLICES, params=params) as response:
        assert await asyncio.wait_for(response.content.read(), 5) == b""


async def test_closing_watches_over_http_ends_open_streams(http, apiserver):
    async with http.get(SLICES, params={"watch": "true"}) as response:
        for _ in range(50):
            if apiserver.store.open_watches:
                break
            await asyncio.sleep(0.01)
        async with http.post("/_emulator/watches/close") as closed:
            assert (await closed.json())["closed"] == 1
        assert await asyncio.wait_for(response.content.read(), 5) == b""
    assert apiserver.store.open_watches == 0


def test_a_selective_watcher_is_handed_only_the_events_it_accepts():
    store = Store(history=100)
    mine = store.subscribe("resourceslices", lambda event: event.obj["spec"]["nodeName"] == "a")
    every = store.subscribe("resourceslices")
    other = store.subscribe("nodes")
    for node in ("a", "b", "c"):
        slice_ = {"metadata": {"name": f"s-{node}"}, "spec": {"nodeName": node}}
        store.put("resourceslices", slice_, event_type="ADDED")
    event = mine.queue.get_nowait()
    assert event is not None
    assert event.obj["metadata"]["name"] == "s-a"
    assert mine.queue.empty()
    assert every.queue.qsize() == 3
    assert other.queue.empty()
    assert store.open_watches == 3
    store.unwatch(every)
    assert store.open_watches == 2
    assert store.close_watches() == 2
    assert mine.queue.get_nowait() is None
