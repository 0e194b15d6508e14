"""The bus client keeps the stored value of a header JetStream repeats beside JetStream's own;
against a real nats-server, a redirected answer read back from a bucket shows where it came
from."""

from __future__ import annotations

import asyncio
import contextlib

import nats.js.errors
import pytest
from nats.aio.client import Client

from shared.bus.client import STORED, ClosingClient
from shared.bus.connection import Bus
from shared.bus.kventry import stored_headers

# A direct get's answer as JetStream sends it for a stored message that was itself a direct
# get's answer (redirected into the bucket): the stored headers first, JetStream's after.
_REPEATED = (
    b"NATS/1.0\r\n"
    b"Nats-Stream: KV_dra_inventory\r\nNats-Subject: $KV.dra_inventory.node-a\r\n"
    b"Nats-Sequence: 7\r\nTraceparent: stored\r\n"
    b"Nats-Stream: KV_dra_inventory\r\nNats-Subject: $KV.dra_inventory.node-b\r\n"
    b"Nats-Sequence: 42\r\nTraceparent: later\r\n\r\n"
)


def test_a_repeated_jetstream_header_keeps_its_stored_value_too():
    headers = ClosingClient._parse_header_lines(_REPEATED.split(b"\r\n", 1)[1])
    assert headers["Nats-Subject"] == "$KV.dra_inventory.node-b"  # nats-py's: the last
    assert headers["Nats-Sequence"] == "42"
    assert headers[STORED + "Nats-Subject"] == "$KV.dra_inventory.node-a"
    assert headers[STORED + "Nats-Sequence"] == "7"
    assert stored_headers(headers) == {
        "Nats-Stream": "KV_dra_inventory",
        "Nats-Subject": "$KV.dra_inventory.node-a",
        "Nats-Sequence": "7",
        "Traceparent": "later",  # not JetStream's: nats-py's rule
    }


def test_headers_said_once_read_as_nats_py_reads_them():
    raw = b"Nats-Stream: S\r\nNats-Sequence: 3\r\nKV-Operation: DEL\r\n\r\n"
    assert ClosingClient._parse_header_lines(raw) == Client._parse_header_lines(raw)


@pytest.mark.integration
async def test_a_direct_get_answer_stored_in_a_key_reads_back_as_from_elsewhere(bus: Bus):
    bucket = bus.names.inventory_bucket
    await bus.kv_put(bucket, "node-a", b"a's value")
    stream = bus.names.kv_stream(bucket)
    # A's direct get, answered onto B's key: the stream stores JetStream's answer there.
    await bus.nc.publish(
        bus.names.js_direct_get(bucket, "node-a"), b"", reply=bus.names.kv_subject(bucket, "node-b")
    )
    await bus.nc.flush()
    for _ in range(100):
        with contextlib.suppress(nats.js.errors.NotFoundError):
            raw = await bus.js.get_msg(
                stream, subject=bus.names.kv_subject(bucket, "node-b"), direct=True
            )
            break
        await asyncio.sleep(0.02)
    assert raw.subject == bus.names.kv_subject(bucket, "node-b")
    assert stored_headers(raw.headers or {})["Nats-Subject"] == bus.names.kv_subject(
        bucket, "node-a"
    )
    assert await bus.checked_get(bucket, "node-b") is None
