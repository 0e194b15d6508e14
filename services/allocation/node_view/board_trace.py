"""Spans for what the kubelet fronts send: each message sent for a traced board change.

The health stream (DRA) and ListAndWatch (device plugin) send after a HealthBoard change; when
that change carried a trace (a health record's write, itself continuing the health agent's
evaluation), the send is a span of it, so one device fault is one trace down to the kubelet.
"""

from __future__ import annotations

from opentelemetry.context import Context

from services.allocation.node_view.health_board import HealthBoard
from shared import telemetry

__all__ = ["traced_send"]

tracer = telemetry.tracer(__name__)


def traced_send(board: HealthBoard, name: str, *, after: Context | None) -> Context | None:
    """Record a span of the board's latest change, once per change and stream (`after`: the
    change the stream last sent); returns the change it now sent. The span is never made
    current: a stream is a generator the gRPC server may resume in another context."""
    trace = board.trace
    if trace is not None and trace is not after:
        tracer.start_span(name, context=trace, attributes={"pool": board.pool}).end()
    return trace
