"""One device under several requests of a claim (two admin-access requests, say) is prepared.

Each (request, device) gets its own CDI device, so that a container referencing one request
gets that request's edits; the names stay unique in the spec and depend on the claim alone.
"""

from __future__ import annotations

import uuid

from services.allocation.cdi import spec_files
from services.allocation.claim.claims import AllocatedClaim, ClaimRef, DeviceResult
from services.allocation.dra import preparer

DRIVER = "sim.dra-suite.io"
NODE = "node-a"


def _claim(uid: str, *results: tuple[str, str]) -> AllocatedClaim:
    return AllocatedClaim(
        ref=ClaimRef(namespace="default", name="claim-a", uid=uid),
        results=tuple(
            DeviceResult(request=r, pool=NODE, device=d, admin_access=True) for r, d in results
        ),
    )


def test_one_device_under_two_requests_gets_a_valid_spec_and_an_answer_per_request(
    make_inventory,
):
    uid = str(uuid.uuid4())
    record = preparer.plan(
        _claim(uid, ("monitor", "npu-0"), ("debug", "npu-0"), ("debug", "npu-1")),
        make_inventory("npu-0", "npu-1"),
        driver=DRIVER,
        backend="sim",
    )
    assert record.cdi_spec is not None
    assert spec_files.validate(record.cdi_spec) == []
    names = [device["name"] for device in record.cdi_spec["devices"]]
    assert len(set(names)) == 3
    answered = [(d.request_names, d.device, d.cdi_device_ids) for d in record.devices]
    assert answered == [
        (("monitor",), "npu-0", (spec_files.device_id(DRIVER, names[0]),)),
        (("debug",), "npu-0", (spec_files.device_id(DRIVER, names[1]),)),
        (("debug",), "npu-1", (spec_files.device_id(DRIVER, names[2]),)),
    ]
    # A device under one request only keeps its usual name.
    assert names[2] == spec_files.device_name(uid, "npu-1")
    envs = [device["containerEdits"]["env"] for device in record.cdi_spec["devices"]]
    assert "DRA_SUITE_DEVICES=npu-0" in envs[0]
    assert "DRA_SUITE_DEVICES=npu-0,npu-1" in envs[1]


def test_the_names_of_a_device_under_two_requests_are_stable_and_fit_cdi():
    uid = str(uuid.uuid4())
    uses = [("a" * 63, "npu-0", None), ("b", "npu-0", None), ("b", "gpu-0", "share-1")]
    first = spec_files.device_names(uid, uses)
    assert first == spec_files.device_names(uid, uses)
    assert len(set(first)) == 3
    assert all(len(name) <= spec_files.MAX_NAME for name in first)
    assert first[1] == f"{uid}-npu-0-b"
    assert first[2] == spec_files.device_name(uid, "gpu-0", "share-1")
