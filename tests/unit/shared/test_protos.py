"""The kubelet protos and the code generated from them (shared/pb/).

Names, numbers and types here are the wire contract with the kubelet
(docs/contracts.md §1-3); a change to any of them breaks real kubelets.
"""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from google.protobuf import unknown_fields
from google.protobuf.descriptor import Descriptor, FieldDescriptor, FileDescriptor
from google.protobuf.message import Message

import shared.pb
from shared.pb.kubelet.dra.v1 import api_pb2 as dra_v1
from shared.pb.kubelet.dra.v1 import api_pb2_grpc as dra_v1_grpc
from shared.pb.kubelet.dra.v1beta1 import api_pb2 as dra_v1beta1
from shared.pb.kubelet.dra.v1beta1 import api_pb2_grpc as dra_v1beta1_grpc
from shared.pb.kubelet.drahealth.v1 import api_pb2 as health_v1
from shared.pb.kubelet.drahealth.v1 import api_pb2_grpc as health_v1_grpc
from shared.pb.kubelet.drahealth.v1alpha1 import api_pb2 as health_v1alpha1
from shared.pb.kubelet.drahealth.v1alpha1 import api_pb2_grpc as health_v1alpha1_grpc
from shared.pb.kubelet.pluginregistration.v1 import api_pb2 as reg_v1
from shared.pb.kubelet.pluginregistration.v1 import api_pb2_grpc as reg_v1_grpc

REPO_ROOT = Path(__file__).resolve().parents[3]
PB_DIR = REPO_ROOT / "shared" / "pb"
GENERATOR = REPO_ROOT / "scripts" / "gen_protos.py"


# --- generated code is current ----------------------------------------------------------


def _tree(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def test_generated_code_matches_protos(tmp_path: Path) -> None:
    out = tmp_path / "pb"
    subprocess.run(
        [sys.executable, str(GENERATOR), "--out", str(out)],
        check=True,
        capture_output=True,
        cwd=tmp_path,
    )
    fresh, committed = _tree(out), _tree(PB_DIR)
    assert sorted(fresh) == sorted(committed), "run scripts/gen_protos.py: file set differs"
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert not stale, f"run scripts/gen_protos.py: stale generated files {stale}"


def test_generator_is_deterministic(tmp_path: Path) -> None:
    trees = []
    for run in ("a", "b"):
        out = tmp_path / run
        subprocess.run(
            [sys.executable, str(GENERATOR), "--out", str(out)], check=True, capture_output=True
        )
        trees.append(_tree(out))
    assert trees[0] == trees[1]


def test_generator_keeps_output_dir_and_drops_stale_files(tmp_path: Path) -> None:
    out = tmp_path / "pb"
    stale = out / "kubelet" / "gone" / "old_pb2.py"
    stale.parent.mkdir(parents=True)
    stale.write_text("raise ImportError\n")
    subprocess.run(
        [sys.executable, str(GENERATOR), "--out", str(out)], check=True, capture_output=True
    )
    assert not stale.exists()
    assert not stale.parent.exists()
    assert (out / "__init__.py").read_text() == (
        '"""Generated from protos/ by scripts/gen_protos.py; never edit by hand."""\n'
    )


# --- all modules load together -----------------------------------------------------------


def _generated_modules() -> list[str]:
    return sorted(
        m.name for m in pkgutil.walk_packages(shared.pb.__path__, "shared.pb.") if not m.ispkg
    )


def test_every_generated_module_imports_in_one_fresh_process() -> None:
    modules = _generated_modules()
    assert len(modules) >= 10
    code = "import importlib, sys\nfor m in sys.argv[1:]:\n    importlib.import_module(m)\n"
    result = subprocess.run(
        [sys.executable, "-c", code, *modules],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_generated_imports_are_rooted_at_shared_pb() -> None:
    unrewritten = ("from kubelet", "import kubelet", "from drasuite", "import drasuite")
    files = sorted([*PB_DIR.rglob("*.py"), *PB_DIR.rglob("*.pyi")])
    assert files
    for path in files:
        for line in path.read_text().splitlines():
            assert not line.startswith(unrewritten), f"{path}: {line!r}"


@pytest.mark.parametrize(
    ("module", "file_name", "package"),
    [
        (dra_v1, "kubelet/dra/v1/api.proto", "k8s.io.kubelet.pkg.apis.dra.v1"),
        (dra_v1beta1, "kubelet/dra/v1beta1/api.proto", "k8s.io.kubelet.pkg.apis.dra.v1beta1"),
        (reg_v1, "kubelet/pluginregistration/v1/api.proto", "pluginregistration"),
        (health_v1alpha1, "kubelet/drahealth/v1alpha1/api.proto", "v1alpha1"),
        (health_v1, "kubelet/drahealth/v1/api.proto", "v1"),
    ],
    ids=["dra-v1", "dra-v1beta1", "pluginregistration", "health-v1alpha1", "health-v1"],
)
def test_file_descriptor_names_and_packages(
    module: ModuleType, file_name: str, package: str
) -> None:
    descriptor: FileDescriptor = module.DESCRIPTOR
    assert descriptor.name == file_name
    assert descriptor.package == package
    assert not descriptor.dependencies
    # The messages say where they live, for reprs and pickling.
    for message_name in descriptor.message_types_by_name:
        assert getattr(module, message_name).__module__ == module.__name__


# --- services and method paths -----------------------------------------------------------


class _RecordingChannel:
    """Stands in for grpc.Channel: records the method paths a Stub binds."""

    def __init__(self) -> None:
        self.paths: dict[str, str] = {}

    def _record(self, kind: str) -> Callable[..., object]:
        def bind(path: str, *args: object, **kwargs: object) -> object:
            self.paths[path] = kind
            return object()

        return bind

    def __getattr__(self, kind: str) -> Callable[..., object]:
        if kind in {"unary_unary", "unary_stream", "stream_unary", "stream_stream"}:
            return self._record(kind)
        raise AttributeError(kind)


_SERVICES = [
    (
        dra_v1,
        dra_v1_grpc.DRAPluginStub,
        "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin",
        {
            "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources": "unary_unary",
            "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources": "unary_unary",
        },
    ),
    (
        dra_v1beta1,
        dra_v1beta1_grpc.DRAPluginStub,
        "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin",
        {
            "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources": "unary_unary",
            "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources": "unary_unary",
        },
    ),
    (
        reg_v1,
        reg_v1_grpc.RegistrationStub,
        "pluginregistration.Registration",
        {
            "/pluginregistration.Registration/GetInfo": "unary_unary",
            "/pluginregistration.Registration/NotifyRegistrationStatus": "unary_unary",
        },
    ),
    (
        health_v1alpha1,
        health_v1alpha1_grpc.DRAResourceHealthStub,
        "v1alpha1.DRAResourceHealth",
        {"/v1alpha1.DRAResourceHealth/NodeWatchResources": "unary_stream"},
    ),
    (
        health_v1,
        health_v1_grpc.DRAResourceHealthStub,
        "v1.DRAResourceHealth",
        {"/v1.DRAResourceHealth/NodeWatchResources": "unary_stream"},
    ),
]
_SERVICE_IDS = ["dra-v1", "dra-v1beta1", "pluginregistration", "health-v1alpha1", "health-v1"]


@pytest.mark.parametrize(("module", "stub", "service", "methods"), _SERVICES, ids=_SERVICE_IDS)
def test_service_and_method_names(
    module: ModuleType, stub: Any, service: str, methods: dict[str, str]
) -> None:
    descriptor: FileDescriptor = module.DESCRIPTOR
    assert [s.full_name for s in descriptor.services_by_name.values()] == [service]
    svc = descriptor.services_by_name[service.rsplit(".", 1)[1]]
    from_descriptor = {
        f"/{svc.full_name}/{m.name}": (
            ("stream" if m.client_streaming else "unary")
            + "_"
            + ("stream" if m.server_streaming else "unary")
        )
        for m in svc.methods
    }
    assert from_descriptor == methods
    channel = _RecordingChannel()
    stub(channel)
    assert channel.paths == methods


@pytest.mark.parametrize(
    ("service", "method", "request_type", "response_type"),
    [
        (
            dra_v1.DESCRIPTOR.services_by_name["DRAPlugin"],
            "NodePrepareResources",
            "k8s.io.kubelet.pkg.apis.dra.v1.NodePrepareResourcesRequest",
            "k8s.io.kubelet.pkg.apis.dra.v1.NodePrepareResourcesResponse",
        ),
        (
            dra_v1.DESCRIPTOR.services_by_name["DRAPlugin"],
            "NodeUnprepareResources",
            "k8s.io.kubelet.pkg.apis.dra.v1.NodeUnprepareResourcesRequest",
            "k8s.io.kubelet.pkg.apis.dra.v1.NodeUnprepareResourcesResponse",
        ),
        (
            dra_v1beta1.DESCRIPTOR.services_by_name["DRAPlugin"],
            "NodePrepareResources",
            "k8s.io.kubelet.pkg.apis.dra.v1beta1.NodePrepareResourcesRequest",
            "k8s.io.kubelet.pkg.apis.dra.v1beta1.NodePrepareResourcesResponse",
        ),
        (
            dra_v1beta1.DESCRIPTOR.services_by_name["DRAPlugin"],
            "NodeUnprepareResources",
            "k8s.io.kubelet.pkg.apis.dra.v1beta1.NodeUnprepareResourcesRequest",
            "k8s.io.kubelet.pkg.apis.dra.v1beta1.NodeUnprepareResourcesResponse",
        ),
        (
            reg_v1.DESCRIPTOR.services_by_name["Registration"],
            "GetInfo",
            "pluginregistration.InfoRequest",
            "pluginregistration.PluginInfo",
        ),
        (
            reg_v1.DESCRIPTOR.services_by_name["Registration"],
            "NotifyRegistrationStatus",
            "pluginregistration.RegistrationStatus",
            "pluginregistration.RegistrationStatusResponse",
        ),
        (
            health_v1alpha1.DESCRIPTOR.services_by_name["DRAResourceHealth"],
            "NodeWatchResources",
            "v1alpha1.NodeWatchResourcesRequest",
            "v1alpha1.NodeWatchResourcesResponse",
        ),
        (
            health_v1.DESCRIPTOR.services_by_name["DRAResourceHealth"],
            "NodeWatchResources",
            "v1.NodeWatchResourcesRequest",
            "v1.NodeWatchResourcesResponse",
        ),
    ],
    ids=[
        "dra-v1-prepare",
        "dra-v1-unprepare",
        "dra-v1beta1-prepare",
        "dra-v1beta1-unprepare",
        "reg-getinfo",
        "reg-notify",
        "health-v1alpha1-watch",
        "health-v1-watch",
    ],
)
def test_method_message_types(
    service: Any, method: str, request_type: str, response_type: str
) -> None:
    m = service.methods_by_name[method]
    assert (m.input_type.full_name, m.output_type.full_name) == (request_type, response_type)


# --- messages: field names, numbers, types, presence --------------------------------------

_SCALARS = {
    FieldDescriptor.TYPE_STRING: "string",
    FieldDescriptor.TYPE_BOOL: "bool",
    FieldDescriptor.TYPE_INT64: "int64",
}


def _describe(field: FieldDescriptor) -> str:
    """'<number> [repeated |optional ]<type>' as it would read in the .proto."""
    message_type, enum_type = field.message_type, field.enum_type
    if message_type is not None:
        if message_type.GetOptions().map_entry:
            key = _describe(message_type.fields_by_name["key"]).split()[1]
            value = _describe(message_type.fields_by_name["value"]).split()[1]
            return f"{field.number} map<{key}, {value}>"
        kind = message_type.full_name
    elif enum_type is not None:
        kind = enum_type.full_name
    else:
        kind = _SCALARS[field.type]
    if field.is_repeated:
        return f"{field.number} repeated {kind}"
    if field.has_presence and message_type is None:
        return f"{field.number} optional {kind}"
    return f"{field.number} {kind}"


def _dra_messages(pkg: str, share_id: bool) -> dict[str, dict[str, str]]:
    device = {
        "request_names": "1 repeated string",
        "pool_name": "2 string",
        "device_name": "3 string",
        "cdi_device_ids": "4 repeated string",
    }
    if share_id:
        device["share_id"] = "5 optional string"
    return {
        "NodePrepareResourcesRequest": {"claims": f"1 repeated {pkg}.Claim"},
        "NodePrepareResourcesResponse": {
            "claims": f"1 map<string, {pkg}.NodePrepareResourceResponse>"
        },
        "NodePrepareResourceResponse": {
            "devices": f"1 repeated {pkg}.Device",
            "error": "2 string",
        },
        "Device": device,
        "NodeUnprepareResourcesRequest": {"claims": f"1 repeated {pkg}.Claim"},
        "NodeUnprepareResourcesResponse": {
            "claims": f"1 map<string, {pkg}.NodeUnprepareResourceResponse>"
        },
        "NodeUnprepareResourceResponse": {"error": "1 string"},
        "Claim": {"namespace": "1 string", "uid": "2 string", "name": "3 string"},
    }


def _health_messages(pkg: str) -> dict[str, dict[str, str]]:
    return {
        "NodeWatchResourcesRequest": {},
        "DeviceIdentifier": {"pool_name": "1 string", "device_name": "2 string"},
        "DeviceHealth": {
            "device": f"1 {pkg}.DeviceIdentifier",
            "health": f"2 {pkg}.HealthStatus",
            "last_updated_time": "3 int64",
            "health_check_timeout_seconds": "4 int64",
            "message": "5 string",
        },
        "NodeWatchResourcesResponse": {"devices": f"1 repeated {pkg}.DeviceHealth"},
    }


_REGISTRATION_MESSAGES = {
    "PluginInfo": {
        "type": "1 string",
        "name": "2 string",
        "endpoint": "3 string",
        "supported_versions": "4 repeated string",
    },
    "RegistrationStatus": {"plugin_registered": "1 bool", "error": "2 string"},
    "RegistrationStatusResponse": {},
    "InfoRequest": {},
}

_FILES: list[tuple[str, ModuleType, dict[str, dict[str, str]]]] = [
    ("dra-v1", dra_v1, _dra_messages("k8s.io.kubelet.pkg.apis.dra.v1", share_id=True)),
    (
        "dra-v1beta1",
        dra_v1beta1,
        _dra_messages("k8s.io.kubelet.pkg.apis.dra.v1beta1", share_id=False),
    ),
    ("pluginregistration", reg_v1, _REGISTRATION_MESSAGES),
    ("health-v1alpha1", health_v1alpha1, _health_messages("v1alpha1")),
    ("health-v1", health_v1, _health_messages("v1")),
]

_MESSAGE_CASES = [
    (module, name, fields) for _, module, messages in _FILES for name, fields in messages.items()
]
_MESSAGE_IDS = [f"{file_id}.{name}" for file_id, _, messages in _FILES for name in messages]


@pytest.mark.parametrize(
    ("module", "messages"), [(m, msgs) for _, m, msgs in _FILES], ids=[f[0] for f in _FILES]
)
def test_no_unexpected_messages(module: ModuleType, messages: dict[str, dict[str, str]]) -> None:
    assert sorted(module.DESCRIPTOR.message_types_by_name) == sorted(messages)


@pytest.mark.parametrize(("module", "message", "fields"), _MESSAGE_CASES, ids=_MESSAGE_IDS)
def test_message_fields(module: ModuleType, message: str, fields: dict[str, str]) -> None:
    descriptor: Descriptor = module.DESCRIPTOR.message_types_by_name[message]
    assert {f.name: _describe(f) for f in descriptor.fields} == fields


@pytest.mark.parametrize("module", [health_v1alpha1, health_v1], ids=["v1alpha1", "v1"])
def test_health_status_enum(module: ModuleType) -> None:
    enum = module.DESCRIPTOR.enum_types_by_name["HealthStatus"]
    assert {v.name: v.number for v in enum.values} == {"UNKNOWN": 0, "HEALTHY": 1, "UNHEALTHY": 2}
    assert list(module.DESCRIPTOR.enum_types_by_name) == ["HealthStatus"]


def test_share_id_presence() -> None:
    unset = dra_v1.Device(pool_name="p", device_name="d")
    empty = dra_v1.Device(pool_name="p", device_name="d", share_id="")
    assert not unset.HasField("share_id")
    assert empty.HasField("share_id")
    # Set-but-empty is on the wire as field 5 (tag 0x2a) with length 0.
    assert b"\x2a\x00" not in unset.SerializeToString()
    assert empty.SerializeToString().endswith(b"\x2a\x00")
    assert dra_v1.Device.FromString(empty.SerializeToString()).HasField("share_id")


# --- wire compatibility between versions --------------------------------------------------


def _unknown_fields(message: Message) -> list[tuple[int, object]]:
    found = unknown_fields.UnknownFieldSet(message)
    return [(found[i].field_number, found[i].data) for i in range(len(found))]


def _v1_response() -> dra_v1.NodePrepareResourcesResponse:
    response = dra_v1.NodePrepareResourcesResponse()
    response.claims["uid-1"].devices.add(
        request_names=["gpu"],
        pool_name="node-a",
        device_name="gpu-0",
        cdi_device_ids=["example.com/gpu=gpu-0"],
        share_id="share-7",
    )
    response.claims["uid-2"].error = "prepare failed"
    return response


def test_v1_with_share_id_parses_as_v1beta1() -> None:
    wire = _v1_response().SerializeToString()
    old = dra_v1beta1.NodePrepareResourcesResponse.FromString(wire)

    assert sorted(old.claims) == ["uid-1", "uid-2"]
    assert old.claims["uid-2"].error == "prepare failed"
    (device,) = old.claims["uid-1"].devices
    assert list(device.request_names) == ["gpu"]
    assert (device.pool_name, device.device_name) == ("node-a", "gpu-0")
    assert list(device.cdi_device_ids) == ["example.com/gpu=gpu-0"]
    unknown = _unknown_fields(device)
    assert unknown == [(5, b"share-7")]

    # An old peer that re-sends the message keeps field 5.
    again = dra_v1.NodePrepareResourcesResponse.FromString(old.SerializeToString())
    assert again == _v1_response()


def test_v1beta1_parses_as_v1_without_share_id() -> None:
    old = dra_v1beta1.NodePrepareResourcesResponse()
    old.claims["uid-1"].devices.add(
        request_names=["gpu"],
        pool_name="node-a",
        device_name="gpu-0",
        cdi_device_ids=["example.com/gpu=gpu-0"],
    )
    old.claims["uid-2"].error = "prepare failed"

    new = dra_v1.NodePrepareResourcesResponse.FromString(old.SerializeToString())

    expected = _v1_response()
    expected.claims["uid-1"].devices[0].ClearField("share_id")
    assert new == expected
    assert not new.claims["uid-1"].devices[0].HasField("share_id")
    assert _unknown_fields(new.claims["uid-1"].devices[0]) == []


@pytest.mark.parametrize(
    ("source", "target"),
    [(health_v1alpha1, health_v1), (health_v1, health_v1alpha1)],
    ids=["v1alpha1-to-v1", "v1-to-v1alpha1"],
)
def test_health_versions_share_a_wire_format(source: ModuleType, target: ModuleType) -> None:
    response = source.NodeWatchResourcesResponse()
    response.devices.add(
        device=source.DeviceIdentifier(pool_name="node-a", device_name="gpu-0"),
        health=source.UNHEALTHY,
        last_updated_time=1_700_000_000,
        health_check_timeout_seconds=45,
        message="XID 79",
    )
    parsed = target.NodeWatchResourcesResponse.FromString(response.SerializeToString())
    (device,) = parsed.devices
    assert (device.device.pool_name, device.device.device_name) == ("node-a", "gpu-0")
    assert device.health == target.UNHEALTHY
    assert (device.last_updated_time, device.health_check_timeout_seconds) == (1_700_000_000, 45)
    assert device.message == "XID 79"
    assert parsed.SerializeToString() == response.SerializeToString()
