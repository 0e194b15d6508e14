"""The v1beta1 DRAPlugin adapter: messages convert to v1 and back, share IDs are dropped."""

from __future__ import annotations

from services.allocation.dra import service
from shared.pb.kubelet.dra.v1 import api_pb2 as v1
from shared.pb.kubelet.dra.v1beta1 import api_pb2 as v1beta1


def test_prepare_request_converts_every_claim():
    request = v1beta1.NodePrepareResourcesRequest(
        claims=[
            v1beta1.Claim(namespace="ns", name="a", uid="u1"),
            v1beta1.Claim(namespace="ns", name="b", uid="u2"),
        ]
    )
    assert service.prepare_request_to_v1(request) == v1.NodePrepareResourcesRequest(
        claims=[
            v1.Claim(namespace="ns", name="a", uid="u1"),
            v1.Claim(namespace="ns", name="b", uid="u2"),
        ]
    )


def test_unprepare_request_converts_every_claim():
    request = v1beta1.NodeUnprepareResourcesRequest(
        claims=[v1beta1.Claim(namespace="ns", name="a", uid="u1")]
    )
    assert service.unprepare_request_to_v1(request) == v1.NodeUnprepareResourcesRequest(
        claims=[v1.Claim(namespace="ns", name="a", uid="u1")]
    )


def test_prepare_response_keeps_devices_and_errors_but_not_share_ids():
    response = v1.NodePrepareResourcesResponse(
        claims={
            "u1": v1.NodePrepareResourceResponse(
                devices=[
                    v1.Device(
                        request_names=["req"],
                        pool_name="node-a",
                        device_name="gpu-0",
                        cdi_device_ids=["k8s.d/claim=u1-gpu-0-s"],
                        share_id="s",
                    )
                ]
            ),
            "u2": v1.NodePrepareResourceResponse(error="prepare claim u2: not allocated"),
        }
    )
    converted = service.prepare_response_to_v1beta1(response)
    assert converted == v1beta1.NodePrepareResourcesResponse(
        claims={
            "u1": v1beta1.NodePrepareResourceResponse(
                devices=[
                    v1beta1.Device(
                        request_names=["req"],
                        pool_name="node-a",
                        device_name="gpu-0",
                        cdi_device_ids=["k8s.d/claim=u1-gpu-0-s"],
                    )
                ]
            ),
            "u2": v1beta1.NodePrepareResourceResponse(error="prepare claim u2: not allocated"),
        }
    )
    # Nothing of field 5 travels as an unknown field either.
    reparsed = v1.NodePrepareResourcesResponse.FromString(converted.SerializeToString())
    assert not reparsed.claims["u1"].devices[0].HasField("share_id")


def test_unprepare_response_keeps_every_entry():
    response = v1.NodeUnprepareResourcesResponse(
        claims={
            "u1": v1.NodeUnprepareResourceResponse(),
            "u2": v1.NodeUnprepareResourceResponse(error="x"),
        }
    )
    converted = service.unprepare_response_to_v1beta1(response)
    assert dict(converted.claims) == {
        "u1": v1beta1.NodeUnprepareResourceResponse(),
        "u2": v1beta1.NodeUnprepareResourceResponse(error="x"),
    }
