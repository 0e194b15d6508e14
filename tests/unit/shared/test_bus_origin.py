"""Telling JetStream's own (redirected) answers from what clients send."""

from __future__ import annotations

import pytest

from shared.bus.origin import is_jetstream_reply

CASES = {
    "a consumer delivery": ("$JS.ACK.KV_x.c.1.1.1.1.0", None, b"\x0a\x03gpu", True),
    "a direct-get answer": ("", {"Nats-Stream": "KV_x", "Nats-Subject": "$KV.x.a"}, b"v", True),
    "a status message": ("", {"Status": "404"}, b"", True),
    "a publish ack": ("", None, b'{"stream":"KV_x","seq":3}', True),
    "an API answer": ("", None, b'{"type":"io.nats.jetstream.api.v1.stream_info_response"}', True),
    "a protobuf value": ("", None, b"\x0a\x10sim.dra-suite.io", False),
    "a request from dractl": (
        "_INBOX.operator.abc.1",
        {"traceparent": "00-1-2-01"},
        b"\x0a",
        False,
    ),
    "a JSON drain request": ("_INBOX.operator.abc.2", None, b'{"device":"gpu-0"}', False),
}


@pytest.mark.parametrize(("reply", "headers", "data", "expected"), CASES.values(), ids=CASES)
def test_is_jetstream_reply(reply, headers, data, expected):
    assert is_jetstream_reply(reply=reply, headers=headers, data=data) is expected
