"""The kubelet's DRAPlugin service: v1, and v1beta1 as a thin adapter converting to v1.

Servicers hold no logic: they turn messages into `ClaimRef`s, delegate to the ClaimPreparer and
turn its outcomes back into messages. Every claim of a request gets an entry keyed by its UID;
a claim's failure goes into that entry's `error` and the call itself succeeds. A claim named
twice in one request is handled once; one UID under two names is refused (UIDs are unique, so
one of them is not that claim). The claims' reads end before the call's deadline, and the
answer's errors are shortened to fit the kubelet's 4 MiB receive limit (`echo`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import grpc
import structlog
from opentelemetry import trace

from services.allocation.claim import echo
from services.allocation.claim.checkpoint import PreparedClaim, PreparedDevice
from services.allocation.claim.claims import ClaimRef
from services.allocation.dra.preparer import ClaimPreparer
from shared import telemetry
from shared.errors import ClaimError
from shared.pb.kubelet.dra.v1 import api_pb2 as v1
from shared.pb.kubelet.dra.v1 import api_pb2_grpc as v1_grpc
from shared.pb.kubelet.dra.v1beta1 import api_pb2 as v1beta1
from shared.pb.kubelet.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc

__all__ = [
    "DRAService",
    "DRAServiceV1Beta1",
    "prepare_request_to_v1",
    "prepare_response_to_v1beta1",
    "unprepare_request_to_v1",
    "unprepare_response_to_v1beta1",
]

log = structlog.get_logger(__name__)
tracer = telemetry.tracer(__name__)
Context = grpc.aio.ServicerContext[Any, Any]

DEFAULT_CALL_BUDGET_S = 40.0
"""The claims' time budget of a call that has no deadline (the kubelet sets 45 s)."""
ANSWER_RESERVE_S = 3.0
"""Kept from the call's deadline for what follows a claim's read (writes, the answer)."""


@contextlib.contextmanager
def _server_span(name: str, context: Context) -> Iterator[trace.Span]:
    parent = telemetry.extract_grpc_metadata(context.invocation_metadata())
    with tracer.start_as_current_span(name, context=parent, kind=trace.SpanKind.SERVER) as span:
        yield span


def _budget_s(context: Context) -> float:
    """How long the claims of a prepare call may take: the kubelet's deadline (45 s) less
    `ANSWER_RESERVE_S` for the writes and the answer, at most `DEFAULT_CALL_BUDGET_S`."""
    remaining = context.time_remaining()
    if remaining is None:
        return DEFAULT_CALL_BUDGET_S
    return max(0.0, min(DEFAULT_CALL_BUDGET_S, remaining - ANSWER_RESERVE_S))


def _refs(claims: Iterable[v1.Claim]) -> list[ClaimRef]:
    """Each UID once: unprepare needs nothing but the UID."""
    return list(
        {c.uid: ClaimRef(namespace=c.namespace, name=c.name, uid=c.uid) for c in claims}.values()
    )


def _distinct_refs(claims: Iterable[v1.Claim]) -> tuple[list[ClaimRef], dict[str, ClaimError]]:
    """Each claim once, and an error for each UID that the request names under two names."""
    first: dict[str, ClaimRef] = {}
    refused: dict[str, ClaimError] = {}
    for claim in claims:
        ref = ClaimRef(namespace=claim.namespace, name=claim.name, uid=claim.uid)
        seen = first.setdefault(ref.uid, ref)
        if seen != ref and ref.uid not in refused:
            refused[ref.uid] = ClaimError(
                f"prepare claim {seen}: uid {echo.clip(ref.uid, 128)!r} is also given to claim "
                f"{ref} in the same request",
                claim_uid=ref.uid,
            )
            log.warning(
                "claim_uid_conflict",
                claim_uid=echo.clip(ref.uid, 128),
                claims=[str(seen), str(ref)],
            )
    return [ref for uid, ref in first.items() if uid not in refused], refused


def _device(device: PreparedDevice) -> v1.Device:
    return v1.Device(
        request_names=device.request_names,
        pool_name=device.pool,
        device_name=device.device,
        cdi_device_ids=device.cdi_device_ids,
        share_id=device.share_id,
    )


def _prepared(outcome: PreparedClaim | ClaimError) -> v1.NodePrepareResourceResponse:
    if isinstance(outcome, ClaimError):
        return v1.NodePrepareResourceResponse(error=str(outcome))
    return v1.NodePrepareResourceResponse(devices=[_device(d) for d in outcome.devices])


def _unprepared(outcome: ClaimError | None) -> v1.NodeUnprepareResourceResponse:
    return v1.NodeUnprepareResourceResponse(error=str(outcome) if outcome else "")


class DRAService(v1_grpc.DRAPluginServicer):
    """`k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin`."""

    def __init__(self, preparer: ClaimPreparer) -> None:
        self._preparer = preparer

    async def NodePrepareResources(
        self, request: v1.NodePrepareResourcesRequest, context: Context
    ) -> v1.NodePrepareResourcesResponse:
        with _server_span("allocation.node_prepare_resources", context) as span:
            span.set_attribute("claims", len(request.claims))
            refs, refused = _distinct_refs(request.claims)
            deadline = asyncio.get_running_loop().time() + _budget_s(context)
            outcomes = await self._preparer.prepare_batch(refs, deadline=deadline)
        claims = {uid: _prepared(outcome) for uid, outcome in {**outcomes, **refused}.items()}
        response = v1.NodePrepareResourcesResponse(claims=claims)
        echo.bound_errors(response.claims.values(), size=response.ByteSize())
        return response

    async def NodeUnprepareResources(
        self, request: v1.NodeUnprepareResourcesRequest, context: Context
    ) -> v1.NodeUnprepareResourcesResponse:
        with _server_span("allocation.node_unprepare_resources", context) as span:
            span.set_attribute("claims", len(request.claims))
            outcomes = await self._preparer.unprepare_batch(_refs(request.claims))
        claims = {uid: _unprepared(outcome) for uid, outcome in outcomes.items()}
        response = v1.NodeUnprepareResourcesResponse(claims=claims)
        echo.bound_errors(response.claims.values(), size=response.ByteSize())
        return response


class DRAServiceV1Beta1(v1beta1_grpc.DRAPluginServicer):
    """`k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin`: converts to v1 and back (no share ID)."""

    def __init__(self, v1_service: DRAService) -> None:
        self._v1 = v1_service

    async def NodePrepareResources(
        self, request: v1beta1.NodePrepareResourcesRequest, context: Context
    ) -> v1beta1.NodePrepareResourcesResponse:
        response = await self._v1.NodePrepareResources(prepare_request_to_v1(request), context)
        return prepare_response_to_v1beta1(response)

    async def NodeUnprepareResources(
        self, request: v1beta1.NodeUnprepareResourcesRequest, context: Context
    ) -> v1beta1.NodeUnprepareResourcesResponse:
        response = await self._v1.NodeUnprepareResources(unprepare_request_to_v1(request), context)
        return unprepare_response_to_v1beta1(response)


def prepare_request_to_v1(
    request: v1beta1.NodePrepareResourcesRequest,
) -> v1.NodePrepareResourcesRequest:
    return v1.NodePrepareResourcesRequest(claims=[_claim_to_v1(c) for c in request.claims])


def unprepare_request_to_v1(
    request: v1beta1.NodeUnprepareResourcesRequest,
) -> v1.NodeUnprepareResourcesRequest:
    return v1.NodeUnprepareResourcesRequest(claims=[_claim_to_v1(c) for c in request.claims])


def _claim_to_v1(claim: v1beta1.Claim) -> v1.Claim:
    return v1.Claim(namespace=claim.namespace, uid=claim.uid, name=claim.name)


def prepare_response_to_v1beta1(
    response: v1.NodePrepareResourcesResponse,
) -> v1beta1.NodePrepareResourcesResponse:
    return v1beta1.NodePrepareResourcesResponse(
        claims={
            uid: v1beta1.NodePrepareResourceResponse(
                devices=[
                    v1beta1.Device(
                        request_names=d.request_names,
                        pool_name=d.pool_name,
                        device_name=d.device_name,
                        cdi_device_ids=d.cdi_device_ids,
                    )
                    for d in answer.devices
                ],
                error=answer.error,
            )
            for uid, answer in response.claims.items()
        }
    )


def unprepare_response_to_v1beta1(
    response: v1.NodeUnprepareResourcesResponse,
) -> v1beta1.NodeUnprepareResourcesResponse:
    return v1beta1.NodeUnprepareResourcesResponse(
        claims={
            uid: v1beta1.NodeUnprepareResourceResponse(error=answer.error)
            for uid, answer in response.claims.items()
        }
    )
