"""The kubelet's DRAResourceHealth service (v1alpha1 and v1): NodeWatchResources streams.

Each message is the complete list of this node's devices (the kubelet expects that), sent when
the stream opens, on every change of the HealthBoard, and every resend interval so that the
kubelet's health timeout never expires while we are alive. Streams end only when we stop.
A message sent for a change that carried a trace (a health record's write) is a span of it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc
import structlog
from opentelemetry import context as otel_context

from services.allocation.node_view.board_trace import traced_send
from services.allocation.node_view.health_board import DeviceHealthView, Health, HealthBoard
from shared.pb.kubelet.drahealth.v1 import api_pb2 as v1
from shared.pb.kubelet.drahealth.v1 import api_pb2_grpc as v1_grpc
from shared.pb.kubelet.drahealth.v1alpha1 import api_pb2 as v1alpha1
from shared.pb.kubelet.drahealth.v1alpha1 import api_pb2_grpc as v1alpha1_grpc

__all__ = ["HealthServiceV1", "HealthServiceV1Alpha1", "snapshots"]

log = structlog.get_logger(__name__)

Context = grpc.aio.ServicerContext[Any, Any]


async def snapshots(
    board: HealthBoard, *, resend_s: float
) -> AsyncIterator[list[DeviceHealthView]]:
    """The board's full list now, after every change, and at least every `resend_s`."""
    while not board.closed:
        changed = board.changed()  # taken before the snapshot, so no change slips through
        yield board.snapshot()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(resend_s):
                await changed.wait()


class HealthServiceV1Alpha1(v1alpha1_grpc.DRAResourceHealthServicer):
    """`v1alpha1.DRAResourceHealth`, the one 1.34-1.36 kubelets use."""

    def __init__(self, board: HealthBoard, *, resend_s: float, timeout_s: int) -> None:
        self._board = board
        self._resend_s = resend_s
        self._timeout_s = timeout_s

    async def NodeWatchResources(
        self, request: v1alpha1.NodeWatchResourcesRequest, context: Context
    ) -> AsyncIterator[v1alpha1.NodeWatchResourcesResponse]:
        log.info("health_stream_opened", version="v1alpha1")
        async for response in self.responses():
            yield response

    async def responses(self) -> AsyncIterator[v1alpha1.NodeWatchResourcesResponse]:
        """The full device list on open, on every change and every `resend_s`."""
        sent: otel_context.Context | None = None
        async for views in snapshots(self._board, resend_s=self._resend_s):
            response = v1alpha1.NodeWatchResourcesResponse(
                devices=[
                    v1alpha1.DeviceHealth(
                        device=v1alpha1.DeviceIdentifier(pool_name=v.pool, device_name=v.device),
                        health=_STATUS[v.health],
                        last_updated_time=v.updated_s,
                        health_check_timeout_seconds=self._timeout_s,
                        message=v.message,
                    )
                    for v in views
                ]
            )
            sent = traced_send(self._board, "allocation.kubelet_health_update", after=sent)
            yield response


class HealthServiceV1(v1_grpc.DRAResourceHealthServicer):
    """`v1.DRAResourceHealth` (kubelet 1.37+): the v1alpha1 stream, re-encoded, since the two
    packages' messages are wire-identical (same fields, numbers and enum values)."""

    def __init__(self, board: HealthBoard, *, resend_s: float, timeout_s: int) -> None:
        self._alpha = HealthServiceV1Alpha1(board, resend_s=resend_s, timeout_s=timeout_s)

    async def NodeWatchResources(
        self, request: v1.NodeWatchResourcesRequest, context: Context
    ) -> AsyncIterator[v1.NodeWatchResourcesResponse]:
        log.info("health_stream_opened", version="v1")
        async for response in self._alpha.responses():
            yield v1.NodeWatchResourcesResponse.FromString(response.SerializeToString())


_STATUS = {
    Health.HEALTHY: v1alpha1.HEALTHY,
    Health.UNHEALTHY: v1alpha1.UNHEALTHY,
    Health.UNKNOWN: v1alpha1.UNKNOWN,
}
