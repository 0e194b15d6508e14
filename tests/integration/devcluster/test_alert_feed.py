"""The demo's alert feed on a stack just started: the alert stream may come after the feed."""

from __future__ import annotations

import asyncio

import pytest

from devcluster import flow
from shared.bus import codec
from shared.bus.connection import Bus
from shared.pb.drasuite.v1 import alert_pb2

pytestmark = pytest.mark.integration


async def test_the_feed_waits_for_a_stream_made_after_it(bus: Bus):
    feed = flow.alert_feed(bus)
    first = asyncio.ensure_future(anext(feed))
    await asyncio.sleep(0.5)
    assert not first.done(), "no stream yet: the feed waits instead of failing"
    names = bus.names
    await bus.ensure_stream(
        name=names.alerts_stream, subjects=[names.alerts_wildcard], max_age_s=3600,
        duplicate_window_s=60,
    )  # fmt: skip
    alert = alert_pb2.Alert(node="node-a", device="gpu-0")
    await bus.publish_js(names.alerts("sim.dra-suite.io", "node-a"), codec.encode_json(alert))
    got = await asyncio.wait_for(first, 10)
    assert (got.node, got.device) == ("node-a", "gpu-0")
    await feed.aclose()
