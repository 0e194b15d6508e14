"""The kubelet device plugin API v1beta1 as generated into shared/pb: the wire contract.

Package, service, method, message and field names and numbers are those of upstream
`k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1/api.proto`; the method paths are what the
kubelet dials. A change to any of them breaks real kubelets.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from google.protobuf.descriptor import FieldDescriptor

from services.allocation.deviceplugin import registration, service
from shared.pb.kubelet.deviceplugin.v1beta1 import api_pb2 as dp
from shared.pb.kubelet.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc

_SCALARS = {
    FieldDescriptor.TYPE_STRING: "string",
    FieldDescriptor.TYPE_BOOL: "bool",
    FieldDescriptor.TYPE_INT64: "int64",
    FieldDescriptor.TYPE_INT32: "int32",
}

MESSAGES = {
    "DevicePluginOptions": {
        "pre_start_required": "1 bool",
        "get_preferred_allocation_available": "2 bool",
    },
    "RegisterRequest": {
        "version": "1 string",
        "endpoint": "2 string",
        "resource_name": "3 string",
        "options": "4 v1beta1.DevicePluginOptions",
    },
    "Empty": {},
    "ListAndWatchResponse": {"devices": "1 repeated v1beta1.Device"},
    "TopologyInfo": {"nodes": "1 repeated v1beta1.NUMANode"},
    "NUMANode": {"ID": "1 int64"},
    "Device": {"ID": "1 string", "health": "2 string", "topology": "3 v1beta1.TopologyInfo"},
    "PreStartContainerRequest": {"devices_ids": "1 repeated string"},
    "PreStartContainerResponse": {},
    "PreferredAllocationRequest": {
        "container_requests": "1 repeated v1beta1.ContainerPreferredAllocationRequest"
    },
    "ContainerPreferredAllocationRequest": {
        "available_deviceIDs": "1 repeated string",
        "must_include_deviceIDs": "2 repeated string",
        "allocation_size": "3 int32",
    },
    "PreferredAllocationResponse": {
        "container_responses": "1 repeated v1beta1.ContainerPreferredAllocationResponse"
    },
    "ContainerPreferredAllocationResponse": {"deviceIDs": "1 repeated string"},
    "AllocateRequest": {"container_requests": "1 repeated v1beta1.ContainerAllocateRequest"},
    "ContainerAllocateRequest": {"devices_ids": "1 repeated string"},
    "CDIDevice": {"name": "1 string"},
    "AllocateResponse": {"container_responses": "1 repeated v1beta1.ContainerAllocateResponse"},
    "ContainerAllocateResponse": {
        "envs": "1 map<string, string>",
        "mounts": "2 repeated v1beta1.Mount",
        "devices": "3 repeated v1beta1.DeviceSpec",
        "annotations": "4 map<string, string>",
        "cdi_devices": "5 repeated v1beta1.CDIDevice",
    },
    "Mount": {"container_path": "1 string", "host_path": "2 string", "read_only": "3 bool"},
    "DeviceSpec": {
        "container_path": "1 string",
        "host_path": "2 string",
        "permissions": "3 string",
    },
}

METHODS = {
    "Registration": {"/v1beta1.Registration/Register": ("unary_unary", "RegisterRequest", "Empty")},
    "DevicePlugin": {
        "/v1beta1.DevicePlugin/GetDevicePluginOptions": (
            "unary_unary",
            "Empty",
            "DevicePluginOptions",
        ),
        "/v1beta1.DevicePlugin/ListAndWatch": ("unary_stream", "Empty", "ListAndWatchResponse"),
        "/v1beta1.DevicePlugin/GetPreferredAllocation": (
            "unary_unary",
            "PreferredAllocationRequest",
            "PreferredAllocationResponse",
        ),
        "/v1beta1.DevicePlugin/Allocate": ("unary_unary", "AllocateRequest", "AllocateResponse"),
        "/v1beta1.DevicePlugin/PreStartContainer": (
            "unary_unary",
            "PreStartContainerRequest",
            "PreStartContainerResponse",
        ),
    },
}


def _describe(field: FieldDescriptor) -> str:
    message_type = field.message_type
    if message_type is not None and message_type.GetOptions().map_entry:
        key = _describe(message_type.fields_by_name["key"]).split()[1]
        value = _describe(message_type.fields_by_name["value"]).split()[1]
        return f"{field.number} map<{key}, {value}>"
    kind = message_type.full_name if message_type is not None else _SCALARS[field.type]
    return f"{field.number} {'repeated ' if field.is_repeated else ''}{kind}"


def test_file_is_named_by_its_path_in_package_v1beta1():
    assert dp.DESCRIPTOR.name == "kubelet/deviceplugin/v1beta1/api.proto"
    assert dp.DESCRIPTOR.package == "v1beta1"
    assert not dp.DESCRIPTOR.dependencies


def test_no_unexpected_messages():
    assert sorted(dp.DESCRIPTOR.message_types_by_name) == sorted(MESSAGES)


@pytest.mark.parametrize(("message", "fields"), MESSAGES.items(), ids=list(MESSAGES))
def test_message_fields_match_upstream(message, fields):
    descriptor = dp.DESCRIPTOR.message_types_by_name[message]
    assert {f.name: _describe(f) for f in descriptor.fields} == fields


class _RecordingChannel:
    """Stands in for grpc.Channel: records the method paths a Stub binds."""

    def __init__(self) -> None:
        self.paths: dict[str, str] = {}

    def __getattr__(self, kind: str) -> Callable[..., object]:
        def bind(path: str, *args: Any, **kwargs: Any) -> object:
            self.paths[path] = kind
            return object()

        return bind


@pytest.mark.parametrize(
    ("service", "stub"),
    [("Registration", dp_grpc.RegistrationStub), ("DevicePlugin", dp_grpc.DevicePluginStub)],
    ids=["registration", "device-plugin"],
)
def test_services_methods_and_paths(service, stub):
    descriptor = dp.DESCRIPTOR.services_by_name[service]
    assert descriptor.full_name == f"v1beta1.{service}"
    found = {
        f"/v1beta1.{service}/{m.name}": (
            ("stream" if m.client_streaming else "unary")
            + "_"
            + ("stream" if m.server_streaming else "unary"),
            m.input_type.name,
            m.output_type.name,
        )
        for m in descriptor.methods
    }
    assert found == METHODS[service]
    channel = _RecordingChannel()
    stub(channel)
    assert channel.paths == {path: kind for path, (kind, _, _) in METHODS[service].items()}


def test_constants_are_the_kubelets():
    assert registration.VERSION == "v1beta1"
    assert str(registration.DEVICE_PLUGIN_PATH) + "/" == "/var/lib/kubelet/device-plugins/"
    assert str(registration.KUBELET_SOCKET) == "/var/lib/kubelet/device-plugins/kubelet.sock"
    assert (service.HEALTHY, service.UNHEALTHY) == ("Healthy", "Unhealthy")


def test_a_response_round_trips_with_upstream_field_numbers():
    response = dp.ListAndWatchResponse()
    response.devices.add(ID="npu-0", health="Healthy").topology.nodes.add(ID=1)
    # field 1 (devices) length-delimited; inside: 1 ID, 2 health, 3 topology{1 nodes{1 ID=1}}
    wire = b"\x0a\x16" + b"\x0a\x05npu-0" + b"\x12\x07Healthy" + b"\x1a\x04\x0a\x02\x08\x01"
    assert response.SerializeToString() == wire
    assert dp.ListAndWatchResponse.FromString(wire) == response
