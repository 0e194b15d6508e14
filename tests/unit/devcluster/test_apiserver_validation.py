"""Validation of written objects: published JSON schemas plus the DRA rules of docs/contracts.md
§4-5."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from devcluster.apiserver import APIError, APIServerEmulator, ClusterConfig

Mutation = Callable[[dict[str, Any]], None]
TAINT = {"key": "example.com/unhealthy", "effect": "NoSchedule"}


def _emulator(version: str = "1.36", **gates: bool) -> APIServerEmulator:
    return APIServerEmulator(ClusterConfig.for_tests(version, **gates))


def _causes(server: APIServerEmulator, obj: dict[str, Any]) -> list[tuple[str, str]]:
    """(field, reason) of every cause when creating `obj`; [] when it is accepted."""
    try:
        server.create_object(obj)
    except APIError as exc:
        error = exc
    else:
        return []
    assert (error.code, error.reason) == (422, "Invalid"), error.message
    assert error.details is not None
    return [(c["field"], c["reason"]) for c in error.details["causes"]]


def _dev(i: int) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return lambda s: s["spec"]["devices"][i]


def _set_attr(key: str, value: dict[str, Any]) -> Mutation:
    return lambda s: s["spec"]["devices"][0]["attributes"].__setitem__(key, value)


def _taints(count: int, effect: str = "NoSchedule", devices: int = 1) -> Mutation:
    def mutate(s: dict[str, Any]) -> None:
        for device in s["spec"]["devices"][:devices]:
            device["taints"] = [
                {"key": f"example.com/t{i}", "effect": effect} for i in range(count)
            ]

    return mutate


def _spec(**fields: Any) -> Mutation:
    return lambda s: s["spec"].update(fields)


def _many_attributes(s: dict[str, Any]) -> None:
    s["spec"]["devices"][0]["attributes"] = {f"a{i}": {"int": i} for i in range(32)}


def _duplicate_names(s: dict[str, Any]) -> None:
    s["spec"]["devices"][1]["name"] = "gpu-0"


def _unknown_field(s: dict[str, Any]) -> None:
    s["spec"]["devices"][0]["colour"] = "green"


def _counter_sets(count: int, with_devices: bool) -> Mutation:
    def mutate(s: dict[str, Any]) -> None:
        s["spec"]["sharedCounters"] = [
            {"name": f"set-{i}", "counters": {"memory": {"value": "80Gi"}}} for i in range(count)
        ]
        if not with_devices:
            del s["spec"]["devices"]

    return mutate


def _consumes(count: int) -> Mutation:
    def mutate(s: dict[str, Any]) -> None:
        s["spec"]["devices"][0]["consumesCounters"] = [
            {"counterSet": f"set-{i}", "counters": {"memory": {"value": "1Gi"}}}
            for i in range(count)
        ]

    return mutate


SLICE_CASES: list[tuple[str, int, Mutation, list[tuple[str, str]]]] = [
    ("1.36", 2, lambda s: None, []),
    ("1.34", 2, lambda s: None, []),
    ("1.36", 128, lambda s: None, []),
    ("1.36", 129, lambda s: None, [("spec.devices", "FieldValueTooMany")]),
    ("1.35", 65, _taints(1, devices=1), [("spec.devices", "FieldValueTooMany")]),
    ("1.36", 65, _taints(1, devices=1), [("spec.devices", "FieldValueTooMany")]),
    ("1.34", 65, _taints(1, devices=1), []),
    ("1.36", 64, _taints(1, devices=64), []),
    (
        "1.36",
        1,
        _set_attr("a/b/c", {"int": 1}),
        [("spec.devices[0].attributes[a/b/c]", "FieldValueInvalid")],
    ),
    (
        "1.36",
        1,
        _set_attr("x" * 33, {"int": 1}),
        [(f"spec.devices[0].attributes[{'x' * 33}]", "FieldValueTooLong")],
    ),
    (
        "1.36",
        1,
        _set_attr("Bad_Domain!/x", {"int": 1}),
        [("spec.devices[0].attributes[Bad_Domain!/x]", "FieldValueInvalid")],
    ),
    (
        "1.36",
        1,
        _set_attr("v", {"version": "1.2"}),
        [("spec.devices[0].attributes[v].version", "FieldValueInvalid")],
    ),
    ("1.36", 1, _set_attr("v", {"version": "1.2.3-rc.1+build.5"}), []),
    (
        "1.36",
        1,
        _set_attr("s", {"string": "x" * 65}),
        [("spec.devices[0].attributes[s].string", "FieldValueTooLong")],
    ),
    (
        "1.36",
        1,
        _set_attr("two", {"int": 1, "bool": True}),
        [("spec.devices[0].attributes[two]", "FieldValueInvalid")],
    ),
    (
        "1.36",
        1,
        _set_attr("none", {}),
        [("spec.devices[0].attributes[none]", "FieldValueRequired")],
    ),
    ("1.36", 1, _many_attributes, [("spec.devices[0].attributes", "FieldValueTooMany")]),
    ("1.36", 2, _duplicate_names, [("spec.devices[1]", "FieldValueDuplicate")]),
    ("1.34", 2, _duplicate_names, [("spec.devices[1].name", "FieldValueDuplicate")]),
    (
        "1.36",
        1,
        lambda s: _dev(0)(s).update(name="GPU_0"),
        [("spec.devices[0].name", "FieldValueInvalid")],
    ),
    (
        "1.36",
        1,
        _taints(1, effect="Evict"),
        [("spec.devices[0].taints[0].effect", "FieldValueNotSupported")],
    ),
    (
        "1.34",
        1,
        _taints(1, effect="None"),
        [("spec.devices[0].taints[0].effect", "FieldValueNotSupported")],
    ),
    ("1.35", 1, _taints(1, effect="None"), []),
    ("1.34", 1, _taints(5), [("spec.devices[0].taints", "FieldValueTooMany")]),
    ("1.35", 1, _taints(5), []),
    ("1.35", 1, _taints(17), [("spec.devices[0].taints", "FieldValueTooMany")]),
    (
        "1.36",
        1,
        lambda s: _dev(0)(s).update(taints=[{"key": "bad key!", "effect": "NoSchedule"}]),
        [("spec.devices[0].taints[0].key", "FieldValueInvalid")],
    ),
    ("1.36", 1, _spec(driver="x" * 64), [("spec.driver", "FieldValueTooLong")]),
    ("1.36", 1, _spec(driver="gpu_example"), [("spec.driver", "FieldValueInvalid")]),
    ("1.36", 1, _spec(driver="GPU.Example.com"), []),
    (
        "1.36",
        1,
        _spec(pool={"name": "a//b", "generation": 0, "resourceSliceCount": 1}),
        [("spec.pool.name", "FieldValueInvalid")],
    ),
    (
        "1.36",
        1,
        _spec(pool={"name": "zone-a/rack-1", "generation": 0, "resourceSliceCount": 1}),
        [],
    ),
    (
        "1.36",
        1,
        _spec(pool={"name": "p", "generation": -1, "resourceSliceCount": 1}),
        [("spec.pool.generation", "FieldValueInvalid")],
    ),
    (
        "1.36",
        1,
        _spec(pool={"name": "p", "generation": 1, "resourceSliceCount": 0}),
        [("spec.pool.resourceSliceCount", "FieldValueInvalid")],
    ),
    ("1.36", 1, lambda s: s["spec"].pop("nodeName"), [("spec", "FieldValueRequired")]),
    ("1.36", 1, _spec(allNodes=True), [("spec", "FieldValueInvalid")]),
    ("1.36", 1, _unknown_field, [("spec.devices[0].colour", "FieldValueInvalid")]),
    ("1.36", 1, _spec(nodeName=7), [("spec.nodeName", "FieldValueTypeInvalid")]),
    (
        "1.36",
        1,
        lambda s: s["metadata"].update(name="Bad_Name"),
        [("metadata.name", "FieldValueInvalid")],
    ),
    (
        "1.36",
        1,
        _counter_sets(9, with_devices=False),
        [("spec.sharedCounters", "FieldValueTooMany")],
    ),
    ("1.36", 1, _counter_sets(1, with_devices=True), [("spec", "FieldValueInvalid")]),
    ("1.34", 1, _counter_sets(1, with_devices=True), []),
    ("1.36", 1, _consumes(3), [("spec.devices[0].consumesCounters", "FieldValueTooMany")]),
    ("1.36", 1, _consumes(2), []),
]


@pytest.mark.parametrize(
    ("version", "devices", "mutate", "expected"),
    SLICE_CASES,
    ids=[
        "valid-1.36", "valid-1.34", "128-devices", "129-devices", "65-tainted-devices-1.35",
        "65-tainted-devices-1.36", "65-tainted-devices-allowed-1.34", "64-tainted-devices",
        "two-slashes-in-attribute-name", "attribute-identifier-too-long", "bad-attribute-domain",
        "bad-semver", "full-semver", "string-over-64-bytes", "two-values-in-attribute",
        "no-value-in-attribute", "33-attributes-and-capacities", "duplicate-device-names",
        "duplicate-device-names-1.34",
        "device-name-not-dns-label", "bad-taint-effect", "none-effect-on-1.34",
        "none-effect-on-1.35", "5-taints-on-1.34", "5-taints-on-1.35", "17-taints-on-1.35",
        "bad-taint-key", "driver-too-long", "driver-not-dns", "driver-upper-case-allowed",
        "empty-pool-segment", "slash-separated-pool", "negative-generation",
        "zero-slice-count", "no-node-selection", "two-node-selections", "unknown-field",
        "wrong-type", "bad-object-name", "9-counter-sets", "counters-and-devices-on-1.36",
        "counters-and-devices-on-1.34", "3-counter-consumptions", "2-counter-consumptions",
    ],
)  # fmt: skip
def test_resource_slice_rules(slice_factory, version, devices, mutate, expected):
    gates = {"DRAPartitionableDevices": True} if version != "1.36" else {}
    server = _emulator(version, **gates)
    obj = slice_factory("s", devices=devices)
    mutate(obj)
    assert _causes(server, obj) == expected


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("driver", "other.example.com"),
        ("nodeName", "node-9"),
        ("pool", {"name": "other", "generation": 1, "resourceSliceCount": 1}),
    ],
    ids=["driver", "node-name", "pool-name"],
)
def test_slice_identity_fields_are_immutable(slice_factory, field, value):
    server = _emulator()
    created = server.create_object(slice_factory("s"))
    created["spec"][field] = value
    with pytest.raises(APIError) as caught:
        server.update_object(created)
    path = "spec.pool.name" if field == "pool" else f"spec.{field}"
    assert caught.value.details["causes"][0]["field"] == path  # type: ignore[index]


async def test_invalid_slice_over_http_returns_kube_status_with_causes(http, slice_factory):
    body = slice_factory("s", devices=129)
    async with http.post("/apis/resource.k8s.io/v1/resourceslices", json=body) as response:
        status = await response.json()
    assert response.status == 422
    assert status["reason"] == "Invalid"
    assert status["message"].startswith(
        'ResourceSlice.resource.k8s.io "s" is invalid: spec.devices: Too many: 129'
    )
    assert status["details"] == {
        "name": "s", "group": "resource.k8s.io", "kind": "ResourceSlice",
        "causes": [{"reason": "FieldValueTooMany", "message": "Too many: 129: must have at most 128 items", "field": "spec.devices"}],  # noqa: E501
    }  # fmt: skip


GATED_DEVICE_FIELDS = {
    "consumesCounters": [{"counterSet": "set-0", "counters": {"memory": {"value": "1Gi"}}}],
    "allowMultipleAllocations": True,
    "bindsToNode": True,
    "bindingConditions": ["attached"],
    "bindingFailureConditions": ["failed"],
}


@pytest.mark.parametrize(
    ("version", "kept"), [("1.35", False), ("1.36", True)], ids=["1.35-drops", "1.36-keeps"]
)
def test_fields_behind_disabled_gates_are_silently_dropped(slice_factory, version, kept):
    server = APIServerEmulator(kubernetes_version=version, feature_gates={"DRADeviceTaints": False})
    obj = slice_factory("s", devices=1, device_extra=dict(GATED_DEVICE_FIELDS, taints=[TAINT]))
    obj["spec"]["devices"][0]["capacity"]["memory"]["requestPolicy"] = {
        "default": "1Gi",
        "validRange": {"min": "1Gi"},
    }
    device = server.create_object(obj)["spec"]["devices"][0]
    assert "taints" not in device
    for field in GATED_DEVICE_FIELDS:
        assert (field in device) == kept, field
    assert ("requestPolicy" in device["capacity"]["memory"]) == kept


def test_claim_tolerations_are_dropped_without_device_taints_gate(claim_factory):
    server = APIServerEmulator(feature_gates={"DRADeviceTaints": False})
    claim = claim_factory("c")
    claim["spec"]["devices"]["requests"][0]["exactly"]["tolerations"] = [{"operator": "Exists"}]
    created = server.create_object(claim)
    assert "tolerations" not in created["spec"]["devices"]["requests"][0]["exactly"]


def test_taint_time_added_is_set_when_omitted_and_kept_when_given(slice_factory):
    server = _emulator()
    given = dict(TAINT, timeAdded="2025-01-01T00:00:00Z")
    obj = slice_factory("s", devices=2)
    obj["spec"]["devices"][0]["taints"] = [TAINT]
    obj["spec"]["devices"][1]["taints"] = [given]
    devices = server.create_object(obj)["spec"]["devices"]
    assert devices[0]["taints"][0]["timeAdded"].endswith("Z")
    assert len(devices[0]["taints"][0]["timeAdded"]) == len("2025-01-01T00:00:00Z")
    assert devices[1]["taints"][0]["timeAdded"] == "2025-01-01T00:00:00Z"


def _rule(**taint: Any) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1beta2", "kind": "DeviceTaintRule",
        "metadata": {"name": "rule"},
        "spec": {"deviceSelector": {"driver": "gpu.example.com"}, "taint": taint},
    }  # fmt: skip


@pytest.mark.parametrize(
    ("taint", "expected"),
    [
        ({"key": "example.com/hot", "effect": "NoExecute"}, []),
        ({"key": "example.com/hot", "effect": "None"}, []),
        (
            {"key": "example.com/hot", "effect": "Evict"},
            [("spec.taint.effect", "FieldValueNotSupported")],
        ),
        ({"key": "bad key", "effect": "NoSchedule"}, [("spec.taint.key", "FieldValueInvalid")]),
        ({"effect": "NoSchedule"}, [("spec.taint.key", "FieldValueRequired")]),
    ],
    ids=["no-execute", "none", "bad-effect", "bad-key", "missing-key"],
)
def test_device_taint_rule_rules(taint, expected):
    assert _causes(_emulator(), _rule(**taint)) == expected


def test_device_taint_rule_time_added_resets_when_effect_changes():
    server = _emulator()
    created = server.create_object(
        _rule(key="example.com/hot", effect="NoSchedule", timeAdded="2025-01-01T00:00:00Z")
    )
    created["spec"]["taint"]["effect"] = "NoExecute"
    updated = server.update_object(created)
    assert updated["spec"]["taint"]["timeAdded"] != "2025-01-01T00:00:00Z"


def _requests(count: int) -> Mutation:
    def mutate(c: dict[str, Any]) -> None:
        c["spec"]["devices"]["requests"] = [
            {"name": f"r{i}", "exactly": {"deviceClassName": "gpu.example.com"}}
            for i in range(count)
        ]

    return mutate


def _request(**fields: Any) -> Mutation:
    return lambda c: c["spec"]["devices"]["requests"].__setitem__(0, {"name": "gpu", **fields})


def _opaque(size: int) -> Mutation:
    def mutate(c: dict[str, Any]) -> None:
        params = {"blob": "x" * size}
        c["spec"]["devices"]["config"] = [
            {"opaque": {"driver": "gpu.example.com", "parameters": params}}
        ]

    return mutate


EXACT = {"deviceClassName": "gpu.example.com"}


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda c: None, []),
        (_requests(32), []),
        (_requests(33), [("spec.devices.requests", "FieldValueTooMany")]),
        (_request(exactly=EXACT, firstAvailable=[{"name": "a", **EXACT}]), [("spec.devices.requests[0]", "FieldValueInvalid")]),  # noqa: E501
        (_request(), [("spec.devices.requests[0]", "FieldValueRequired")]),
        (_request(firstAvailable=[{"name": "a", **EXACT}]), []),
        (lambda c: c["spec"]["devices"]["requests"][0].update(name="Bad_Name"), [("spec.devices.requests[0].name", "FieldValueInvalid")]),  # noqa: E501
        (_opaque(100), []),
        (_opaque(11 * 1024), [("spec.devices.config[0].opaque.parameters", "FieldValueTooLong")]),
    ],
    ids=[
        "valid", "32-requests", "33-requests", "exactly-and-first-available", "neither",
        "first-available", "bad-request-name", "small-opaque", "opaque-over-10KiB",
    ],
)  # fmt: skip
def test_resource_claim_rules(claim_factory, mutate, expected):
    claim = claim_factory("c")
    mutate(claim)
    assert _causes(_emulator(), claim) == expected


def test_claim_status_with_33_results_is_rejected(claim_factory):
    server = _emulator()
    created = server.create_object(claim_factory("c"))
    result = {"request": "gpu", "driver": "gpu.example.com", "pool": "node-1", "device": "gpu-0"}
    created["status"] = {"allocation": {"devices": {"results": [result] * 33}}}
    with pytest.raises(APIError) as caught:
        server.update_object(created, status=True)
    causes = caught.value.details["causes"]  # type: ignore[index]
    assert causes[0]["field"] == "status.allocation.devices.results"


def test_device_class_selector_needs_an_expression():
    device_class = {
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu"},
        "spec": {"selectors": [{"cel": {"expression": ""}}]},
    }  # fmt: skip
    assert _causes(_emulator(), device_class) == [
        ("spec.selectors[0].cel.expression", "FieldValueRequired")
    ]
