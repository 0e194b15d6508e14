"""Claims: which allocation results this plugin prepares, and how a claim read can fail."""

from __future__ import annotations

import re
import uuid

import pytest

from services.allocation.claim import claims
from services.allocation.claim.claims import ClaimReader, ClaimRef
from shared.errors import (
    ClaimError,
    ClaimNotAllocatedError,
    ClaimNotFoundError,
    ClaimUIDMismatchError,
    DeviceNotAllocatableError,
    KubeTransientError,
)

DRIVER = "sim.dra-suite.io"
NODE = "node-a"


def new_uid() -> str:
    return str(uuid.uuid4())


def _ref(uid: str) -> ClaimRef:
    return ClaimRef(namespace="default", name="claim-a", uid=uid)


@pytest.mark.parametrize(
    ("name", "base"),
    [("gpu", "gpu"), ("gpu/large", "gpu"), ("a/b/c", "a"), ("", "")],
    ids=["plain", "subrequest", "nested-slash", "empty"],
)
def test_base_request_strips_the_subrequest(name, base):
    assert claims.base_request(name) == base


@pytest.mark.parametrize(
    ("result", "kept"),
    [
        ({"driver": DRIVER, "pool": NODE, "device": "npu-1"}, True),
        ({"driver": "other.example.com", "pool": NODE, "device": "npu-1"}, False),
        ({"driver": "other.example.com", "pool": "node-b", "device": "npu-1"}, False),
    ],
    ids=["ours", "other-driver", "other-driver-other-pool"],
)
def test_select_keeps_only_results_of_our_driver(make_claim, result, kept):
    uid = new_uid()
    claim = make_claim(uid=uid, devices=["npu-0"], extra_results=[{"request": "req", **result}])
    selected = claims.select(claim, ref=_ref(uid), driver=DRIVER, pool=NODE, node=NODE)
    assert [r.device for r in selected.results] == (["npu-0", "npu-1"] if kept else ["npu-0"])


def test_select_rejects_a_result_of_our_driver_on_another_nodes_pool(make_claim):
    uid = new_uid()
    foreign = {"request": "req", "driver": DRIVER, "pool": "node-b", "device": "npu-1"}
    claim = make_claim(uid=uid, devices=["npu-0"], extra_results=[foreign])
    with pytest.raises(DeviceNotAllocatableError, match=r"'npu-1' .* pool 'node-b'") as caught:
        claims.select(claim, ref=_ref(uid), driver=DRIVER, pool=NODE, node=NODE)
    assert caught.value.device == "npu-1"


@pytest.mark.parametrize(
    ("status", "field"),
    [
        ({"allocation": ["npu-0"]}, "status.allocation:"),
        ({"allocation": {"devices": {"results": "npu-0"}}}, "status.allocation.devices.results:"),
        ({"allocation": {"devices": {"results": [7]}}}, "results[0]:"),
        (
            {"allocation": {"devices": {"results": [{"driver": DRIVER, "device": 7}]}}},
            "results[0].device:",
        ),
        (
            {
                "allocation": {
                    "devices": {
                        "results": [{"driver": DRIVER, "pool": NODE, "device": "npu-0"}],
                        "config": [{"opaque": {"driver": DRIVER, "parameters": [1, 2]}}],
                    }
                }
            },
            "config[0].opaque.parameters: expected an object, got list",
        ),
    ],
    ids=["allocation", "results", "result", "device", "parameters"],
)
def test_select_names_the_field_of_an_allocation_of_the_wrong_shape(make_claim, status, field):
    uid = new_uid()
    claim = {**make_claim(uid=uid), "status": status}
    with pytest.raises(ClaimError, match=re.escape(field)):
        claims.select(claim, ref=_ref(uid), driver=DRIVER, pool=NODE, node=NODE)


def test_select_reduces_request_names_and_keeps_share_ids(make_claim):
    uid = new_uid()
    share = "1b4e28ba-2fa1-11d2-883f-0016d3cca427"
    claim = make_claim(
        uid=uid,
        devices=[],
        extra_results=[
            {"request": "gpu/large", "driver": DRIVER, "pool": NODE, "device": "gpu-0"},
            {"request": "mem", "driver": DRIVER, "pool": NODE, "device": "gpu-1", "shareID": share},
        ],
    )
    selected = claims.select(claim, ref=_ref(uid), driver=DRIVER, pool=NODE, node=NODE)
    assert [(r.request, r.device, r.share_id) for r in selected.results] == [
        ("gpu", "gpu-0", None),
        ("mem", "gpu-1", share),
    ]


def test_select_rejects_a_claim_whose_uid_changed(make_claim):
    claim = make_claim(uid=new_uid())
    with pytest.raises(ClaimUIDMismatchError, match="claim default/claim-a got replaced"):
        claims.select(claim, ref=_ref(new_uid()), driver=DRIVER, pool=NODE, node=NODE)


def test_select_rejects_a_claim_without_allocation(make_claim):
    uid = new_uid()
    with pytest.raises(ClaimNotAllocatedError, match="not allocated"):
        claims.select(
            make_claim(uid=uid, allocated=False), ref=_ref(uid), driver=DRIVER, pool=NODE, node=NODE
        )


def test_select_orders_opaque_configs_class_first_and_keeps_only_ours(make_claim):
    uid = new_uid()

    def entry(source: str, driver: str, marker: str) -> dict[str, object]:
        return {
            "source": source,
            "requests": ["req"],
            "opaque": {"driver": driver, "parameters": {"marker": marker}},
        }

    claim = make_claim(
        uid=uid,
        config=[
            entry("FromClaim", DRIVER, "claim-1"),
            entry("FromClass", "other.example.com", "foreign"),
            entry("FromClass", DRIVER, "class-1"),
            entry("FromClaim", DRIVER, "claim-2"),
        ],
    )
    selected = claims.select(claim, ref=_ref(uid), driver=DRIVER, pool=NODE, node=NODE)
    assert [c.parameters["marker"] for c in selected.configs] == ["class-1", "claim-1", "claim-2"]
    assert all(c.applies_to("req") for c in selected.configs)


@pytest.mark.parametrize(
    ("requests", "name", "applies"),
    [((), "any", True), (("a/b",), "a", True), (("a",), "b", False)],
    ids=["empty-means-all", "subrequest-matches-base", "other-request"],
)
def test_opaque_config_applies_to_requests(requests, name, applies):
    config = claims.OpaqueConfig(source="FromClaim", requests=requests, parameters={})
    assert config.applies_to(name) is applies


async def test_reader_reports_a_missing_claim_as_not_found(kube_reader):
    reader = ClaimReader(kube_reader, driver=DRIVER, pool=NODE, node=NODE)
    with pytest.raises(ClaimNotFoundError, match="claim default/claim-a: not found"):
        await reader.read(_ref(new_uid()))


async def test_reader_retries_transient_api_errors_then_succeeds(kube_reader, make_claim):
    uid = new_uid()
    kube = kube_reader
    kube.put(make_claim(uid=uid))
    kube.errors.append(KubeTransientError("get: 503", status=503))
    selected = await ClaimReader(kube, driver=DRIVER, pool=NODE).read(_ref(uid))
    assert [r.device for r in selected.results] == ["npu-0"]
    assert kube.gets == 2


async def test_reader_turns_persistent_api_errors_into_the_claims_error(kube_reader):
    kube = kube_reader
    kube.errors.append(KubeTransientError("get: 503", status=503))
    reader = ClaimReader(kube, driver=DRIVER, pool=NODE, attempts=1)
    with pytest.raises(ClaimError, match="reading it failed"):
        await reader.read(_ref(new_uid()))


@pytest.mark.parametrize(
    ("namespace", "name", "problem"),
    [
        ("", "claim-a", "malformed namespace ''"),
        ("../..", "claim-a", "malformed namespace"),
        ("default", "", "malformed name ''"),
        ("default", "a/b", "malformed name 'a/b'"),
        ("default", "x?watch=1", "malformed name"),
    ],
    ids=["empty-namespace", "namespace-path", "empty-name", "name-path", "name-query"],
)
async def test_reader_rejects_names_that_are_not_kube_names_before_any_get(
    kube_reader, namespace, name, problem
):
    reader = ClaimReader(kube_reader, driver=DRIVER, pool=NODE, node=NODE)
    with pytest.raises(ClaimError, match=re.escape(problem)):
        await reader.read(ClaimRef(namespace=namespace, name=name, uid=new_uid()))
    assert kube_reader.gets == 0


def test_reserved_pods_are_the_pod_entries_of_reserved_for_once_each():
    claim = {
        "status": {
            "reservedFor": [
                {"resource": "pods", "name": "a", "uid": "uid-a"},
                {"resource": "pods", "name": "a", "uid": "uid-a"},
                {"resource": "pods", "name": "b", "uid": "uid-b"},
                {"resource": "jobs", "apiGroup": "batch", "name": "j", "uid": "uid-j"},
                {"resource": "pods", "apiGroup": "example.com", "name": "c", "uid": "uid-c"},
                {"resource": "pods", "name": "Not A Name", "uid": "x"},
                {"resource": "pods", "name": 7},
                "garbage",
            ]
        }
    }
    pods = claims.reserved_pods(claim, namespace="ns")
    assert [(p.namespace, p.name, p.uid) for p in pods] == [
        ("ns", "a", "uid-a"),
        ("ns", "b", "uid-b"),
    ]
    assert claims.reserved_pods({"status": {"reservedFor": "x"}}, namespace="ns") == ()
    assert claims.reserved_pods({}, namespace="ns") == ()
