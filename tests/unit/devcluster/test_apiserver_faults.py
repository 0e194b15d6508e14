"""Fault injection and the request log of the API server emulator."""

from __future__ import annotations

import asyncio
import time

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from devcluster.apiserver import FaultRule

SLICES = "/apis/resource.k8s.io/v1/resourceslices"


@pytest.mark.parametrize(
    ("status", "reason"),
    [(500, "InternalError"), (409, "Conflict"), (503, "ServiceUnavailable")],
    ids=["internal-error", "conflict", "unavailable"],
)
async def test_error_fault_fails_matching_requests_n_times(
    http, apiserver, slice_factory, status, reason
):
    apiserver.faults.add(verb="create", resource="resourceslices", status=status, times=2)
    results = []
    for name in ("a", "b", "c"):
        async with http.post(SLICES, json=slice_factory(name)) as response:
            body = await response.json()
            results.append((response.status, body.get("reason")))
    assert results == [(status, reason), (status, reason), (201, None)]
    assert [o["metadata"]["name"] for o in apiserver.objects("resourceslices")] == ["c"]


async def test_too_many_requests_fault_sets_retry_after(http, apiserver):
    apiserver.faults.add(verb="list", status=429, retry_after_s=3, times=1)
    async with http.get(SLICES) as response:
        body = await response.json()
        assert response.status == 429
        assert response.headers["Retry-After"] == "3"
    assert body["reason"] == "TooManyRequests"
    assert body["details"]["retryAfterSeconds"] == 3


async def test_kubernetes_asyncio_sees_injected_errors_as_api_exceptions(
    kube, apiserver, slice_factory
):
    apiserver.faults.add(FaultRule(method="POST", status=500, times=1))
    api = client.ResourceV1Api(kube)
    with pytest.raises(ApiException) as caught:
        await api.create_resource_slice(body=slice_factory("s"))
    assert caught.value.status == 500
    await api.create_resource_slice(body=slice_factory("s"))


async def test_fault_matches_only_the_named_object(http, apiserver, slice_factory):
    apiserver.create_object(slice_factory("a"))
    apiserver.create_object(slice_factory("b"))
    apiserver.faults.add(verb="get", name="a", status=500)
    async with http.get(f"{SLICES}/a") as a, http.get(f"{SLICES}/b") as b:
        assert (a.status, b.status) == (500, 200)


async def test_probability_zero_never_fires(http, apiserver):
    rule = apiserver.faults.add(verb="list", status=500, probability=0.0)
    async with http.get(SLICES) as response:
        assert response.status == 200
    assert rule.hits == 0


async def test_latency_fault_delays_the_response(http, apiserver):
    apiserver.faults.add(verb="list", latency_s=0.2, times=1)
    started = time.monotonic()
    async with http.get(SLICES) as response:
        assert response.status == 200
    assert time.monotonic() - started >= 0.2


async def test_cut_watch_fault_ends_the_stream(http, apiserver):
    apiserver.faults.add(verb="watch", cut_watch_after_s=0.1)
    async with http.get(SLICES, params={"watch": "true"}) as response:
        assert await asyncio.wait_for(response.content.read(), 5) == b""


async def test_faults_are_managed_over_http(http, apiserver):
    rule = {"verb": "delete", "resource": "resourceslices", "status": 500, "times": 1}
    async with http.post("/_emulator/faults", json=rule) as response:
        assert response.status == 201
        [added] = (await response.json())["items"]
    assert apiserver.faults.rules[0].id == added["id"]
    async with http.get("/_emulator/faults") as response:
        assert len((await response.json())["items"]) == 1
    async with http.delete("/_emulator/faults") as response:
        assert response.status == 200
    assert apiserver.faults.rules == []


async def test_unknown_fault_fields_are_rejected_over_http(http):
    async with http.post("/_emulator/faults", json={"verbs": "create"}) as response:
        assert response.status == 400


async def test_request_log_counts_writes_per_verb_and_resource(
    http, kube, apiserver, slice_factory
):
    api = client.ResourceV1Api(kube)
    await api.create_resource_slice(body=slice_factory("a"))
    await api.create_resource_slice(body=slice_factory("b"))
    await api.patch_resource_slice("a", body={"metadata": {"labels": {"x": "y"}}})
    await api.list_resource_slice()
    await api.delete_resource_slice("b")
    log = apiserver.request_log
    assert log.count(verb="create", resource="resourceslices") == 2
    assert log.count(verb="patch", resource="resourceslices") == 1
    assert log.count(verb="list") == 1
    assert [r.verb for r in log.writes(resource="resourceslices")] == [
        "create",
        "create",
        "patch",
        "delete",
    ]
    assert [r.status for r in log.writes()] == [201, 201, 200, 200]
    record = log.records(verb="delete")[0]
    assert (record.method, record.path, record.name) == ("DELETE", f"{SLICES}/b", "b")
    log.clear()
    assert len(log) == 0


async def test_request_log_marks_faulted_requests_and_is_served_over_http(http, apiserver):
    apiserver.faults.add(verb="list", status=500, times=1)
    async with http.get(SLICES, params={"labelSelector": "a=b"}):
        pass
    async with http.get("/_emulator/requests", params={"verb": "list"}) as response:
        [record] = (await response.json())["items"]
    assert record["status"] == 500
    assert record["fault"] is True
    assert record["resource"] == "resourceslices"
    assert record["query"] == {"labelSelector": "a=b"}


async def test_request_log_records_status_subresource_and_namespace(http, apiserver, claim_factory):
    apiserver.create_object(claim_factory("c", namespace="team-a"))
    path = "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/c/status"
    headers = {"Content-Type": "application/merge-patch+json"}
    async with http.patch(path, json={"status": {}}, headers=headers) as response:
        assert response.status == 200
    [record] = apiserver.request_log.records(verb="patch")
    assert (record.resource, record.subresource, record.namespace) == (
        "resourceclaims",
        "status",
        "team-a",
    )
