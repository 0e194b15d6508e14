"""Undecodable requests get INVALID_ARGUMENT instead of grpc's UNKNOWN and an ERROR traceback.

grpc.aio deserializes a request before any servicer runs, so a payload that is not the
method's protobuf message escapes as an exception inside grpc itself. This interceptor wraps
each handler's deserializer: bytes that do not decode become an `Undecodable` marker, and the
wrapped behaviour aborts that call with a status naming the method. Well-formed calls take
the handler unchanged apart from one isinstance check.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeAlias

import grpc
import structlog
from google.protobuf.message import DecodeError

__all__ = ["DecodeGuard", "Undecodable"]

log = structlog.get_logger(__name__)

# The stubs make these generic; at run time they are plain classes.
Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"
Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"


@dataclass(frozen=True, slots=True)
class Undecodable:
    """What a guarded deserializer returns for bytes that are not the expected message."""

    error: str


def _guarded(deserialize: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def decode(data: bytes) -> Any:
        try:
            return deserialize(data)
        except (DecodeError, ValueError, TypeError) as exc:
            return Undecodable(error=str(exc) or type(exc).__name__)

    return decode


async def _abort(context: Context, method: str, request: Undecodable) -> None:
    log.warning("grpc_request_undecodable", method=method, error=request.error[:200])
    await context.abort(
        grpc.StatusCode.INVALID_ARGUMENT,
        f"{method}: the request is not a valid protobuf message: {request.error[:200]}",
    )


def _unary_unary(
    behaviour: Callable[[Any, Context], Awaitable[Any]], method: str
) -> Callable[[Any, Context], Awaitable[Any]]:
    async def call(request: Any, context: Context) -> Any:
        if isinstance(request, Undecodable):
            await _abort(context, method, request)
        return await behaviour(request, context)

    return call


def _unary_stream(
    behaviour: Callable[[Any, Context], AsyncIterator[Any]], method: str
) -> Callable[[Any, Context], AsyncIterator[Any]]:
    async def call(request: Any, context: Context) -> AsyncIterator[Any]:
        if isinstance(request, Undecodable):
            await _abort(context, method, request)
        async for response in behaviour(request, context):
            yield response

    return call


class DecodeGuard(grpc.aio.ServerInterceptor):
    """Guard the unary-request methods (all that the kubelet and registration APIs have)."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        handler = await continuation(handler_call_details)
        # grpc's stubs type behaviours as sync; on an aio server they are coroutine functions.
        behaviours: Any = handler
        if handler is None or handler.request_deserializer is None or handler.request_streaming:
            return handler
        method: str = handler_call_details.method
        deserializer = _guarded(handler.request_deserializer)
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                _unary_unary(behaviours.unary_unary, method),
                request_deserializer=deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                _unary_stream(behaviours.unary_stream, method),
                request_deserializer=deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler
