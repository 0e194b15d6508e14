"""Admin access to devices (KEP-5018) as kube-apiserver admits it: a claim or template asking
for it, or a status granting it, only in a namespace labelled
`resource.kubernetes.io/admin-access: "true"`, refused otherwise with kube's message."""

from __future__ import annotations

from typing import Any

import pytest

from devcluster.apiserver import APIError, APIServerEmulator, ClusterConfig

LABEL = "resource.kubernetes.io/admin-access"
FORBIDDEN = (
    "spec.devices.requests[1].adminAccess: Forbidden: admin access to devices requires the "
    "`resource.kubernetes.io/admin-access: true` label on the containing namespace"
)


def _emulator(**gates: bool) -> APIServerEmulator:
    return APIServerEmulator(ClusterConfig.for_tests("1.36", **gates))


def _namespace(server: APIServerEmulator, name: str, **labels: str) -> None:
    meta: dict[str, Any] = {"name": name, "labels": labels}
    server.create_object({"apiVersion": "v1", "kind": "Namespace", "metadata": meta})


def _requests(admin: bool) -> list[dict[str, Any]]:
    plain = {"name": "plain", "exactly": {"deviceClassName": "npu"}}
    monitor = {"name": "monitor", "exactly": {"deviceClassName": "npu", "adminAccess": admin}}
    return [plain, monitor]


def _claim(namespace: str, *, admin: bool = True) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "inspect", "namespace": namespace},
        "spec": {"devices": {"requests": _requests(admin)}},
    }


def _template(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "inspect", "namespace": namespace},
        "spec": {"spec": {"devices": {"requests": _requests(True)}}},
    }


def _refused(server: APIServerEmulator, obj: dict[str, Any]) -> APIError:
    with pytest.raises(APIError) as caught:
        server.create_object(obj)
    return caught.value


@pytest.mark.parametrize("make", [_claim, _template], ids=["claim", "template"])
def test_admin_access_in_an_unlabelled_namespace_is_forbidden(make: Any):
    server = _emulator()
    _namespace(server, "team-a")
    error = _refused(server, make("team-a"))
    assert (error.code, error.reason) == (422, "Invalid")
    assert FORBIDDEN in error.message
    assert error.details is not None
    assert error.details["causes"][0] == {
        "reason": "FieldValueForbidden",
        "message": FORBIDDEN.split(": ", 1)[1],
        "field": "spec.devices.requests[1].adminAccess",
    }


@pytest.mark.parametrize("make", [_claim, _template], ids=["claim", "template"])
def test_admin_access_in_a_labelled_namespace_is_admitted(make: Any):
    server = _emulator()
    _namespace(server, "monitoring", **{LABEL: "true"})
    server.create_object(make("monitoring"))


def test_a_label_other_than_true_does_not_grant_it():
    server = _emulator()
    _namespace(server, "team-a", **{LABEL: "yes"})
    assert FORBIDDEN in _refused(server, _claim("team-a")).message


def test_a_namespace_that_does_not_exist_cannot_be_verified():
    error = _refused(_emulator(), _claim("nowhere"))
    assert error.code == 422
    assert (
        "spec.devices.requests[1].adminAccess: Internal error: could not retrieve namespace "
        'to verify admin access: namespaces "nowhere" not found'
    ) in error.message


def test_claims_without_admin_access_need_no_namespace():
    server = _emulator()
    server.create_object(_claim("nowhere", admin=False))


def test_with_the_gate_off_the_field_is_dropped_and_nothing_is_checked():
    server = _emulator(DRAAdminAccess=False)
    _namespace(server, "team-a")
    created = server.create_object(_claim("team-a"))
    assert "adminAccess" not in created["spec"]["devices"]["requests"][1]["exactly"]


def test_a_status_granting_admin_access_needs_the_label_too():
    server = _emulator()
    _namespace(server, "team-a")
    created = server.create_object(_claim("team-a", admin=False))
    result = {"request": "monitor", "driver": "d.example.com", "pool": "p", "device": "npu-0"}
    created["status"] = {"allocation": {"devices": {"results": [{**result, "adminAccess": True}]}}}
    with pytest.raises(APIError) as caught:
        server.update_object(created, status=True)
    assert (
        "status.allocation.devices.results[0].adminAccess: Forbidden: admin access to devices "
        "requires the"
    ) in caught.value.message
