"""CRUD verbs of the API server emulator, through kubernetes-asyncio and raw HTTP."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from devcluster.apiserver import APIError, APIServerEmulator, ClusterConfig

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"


async def test_slice_round_trips_through_kubernetes_asyncio(kube, slice_factory):
    api = client.ResourceV1Api(kube)
    created = await api.create_resource_slice(body=slice_factory("s1"))
    assert created.metadata.uid
    assert created.metadata.generation == 1
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ",
        created.to_dict()["metadata"]["creation_timestamp"].strftime("%Y-%m-%dT%H:%M:%SZ"),
    )
    read = await api.read_resource_slice("s1")
    assert read.spec.devices[1].attributes["index"].int == 1
    listed = await api.list_resource_slice()
    assert [s.metadata.name for s in listed.items] == ["s1"]
    assert int(listed.metadata.resource_version) >= int(created.metadata.resource_version)
    read.spec.pool.generation = 2
    replaced = await api.replace_resource_slice("s1", body=read)
    assert replaced.metadata.generation == 2
    assert int(replaced.metadata.resource_version) > int(created.metadata.resource_version)
    deleted = await api.delete_resource_slice("s1")
    assert deleted.metadata.name == "s1"
    with pytest.raises(ApiException) as caught:
        await api.read_resource_slice("s1")
    assert caught.value.status == 404


async def test_resource_versions_increase_across_all_resources(
    apiserver, slice_factory, claim_factory
):
    first = apiserver.create_object(slice_factory("a"))
    second = apiserver.create_object(claim_factory("c"))
    third = apiserver.create_object(slice_factory("b"))
    versions = [int(o["metadata"]["resourceVersion"]) for o in (first, second, third)]
    assert versions == sorted(versions)
    assert len(set(versions)) == 3


async def test_generate_name_truncates_base_and_appends_five_characters(http, slice_factory):
    body = slice_factory("")
    del body["metadata"]["name"]
    body["metadata"]["generateName"] = "x" * 70
    async with http.post(SLICES, json=body) as response:
        assert response.status == 201
        name = (await response.json())["metadata"]["name"]
    assert name.startswith("x" * 58)
    assert re.fullmatch(r"x{58}[a-z0-9]{5}", name)


async def test_create_without_name_or_generate_name_is_invalid(http, slice_factory):
    body = slice_factory("")
    async with http.post(SLICES, json=body) as response:
        status = await response.json()
    assert response.status == 422
    assert status["details"]["causes"][0]["field"] == "metadata.name"


async def test_creating_an_existing_name_returns_already_exists_status(http, slice_factory):
    async with http.post(SLICES, json=slice_factory("dup")) as response:
        assert response.status == 201
    async with http.post(SLICES, json=slice_factory("dup")) as response:
        status = await response.json()
    assert response.status == 409
    assert status == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'resourceslices.resource.k8s.io "dup" already exists',
        "reason": "AlreadyExists",
        "code": 409,
        "details": {"name": "dup", "group": "resource.k8s.io", "kind": "resourceslices"},
    }


async def test_update_with_stale_resource_version_conflicts(http, apiserver, slice_factory):
    created = apiserver.create_object(slice_factory("s"))
    fresh = dict(
        created,
        spec=dict(
            created["spec"], pool={"name": "node-1", "generation": 2, "resourceSliceCount": 1}
        ),
    )
    async with http.put(f"{SLICES}/s", json=fresh) as response:
        assert response.status == 200
    async with http.put(f"{SLICES}/s", json=created) as response:
        status = await response.json()
    assert response.status == 409
    assert status["reason"] == "Conflict"
    assert "the object has been modified" in status["message"]


async def test_update_of_missing_object_is_not_found(http, slice_factory):
    async with http.put(f"{SLICES}/ghost", json=slice_factory("ghost")) as response:
        assert response.status == 404
        assert (await response.json())["reason"] == "NotFound"


async def test_update_without_resource_version_is_unconditional(http, apiserver, slice_factory):
    apiserver.create_object(slice_factory("s"))
    async with http.put(f"{SLICES}/s", json=slice_factory("s", devices=3)) as response:
        assert response.status == 200
        assert len((await response.json())["spec"]["devices"]) == 3


async def test_noop_update_keeps_resource_version_and_generation(apiserver, slice_factory):
    created = apiserver.create_object(slice_factory("s"))
    again = apiserver.update_object(created)
    assert again["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
    assert again["metadata"]["generation"] == 1


async def test_rewriting_an_unchanged_model_is_a_noop(kube, slice_factory):
    body = slice_factory("s")
    body["spec"]["devices"][0]["taints"] = [{"key": "example.com/hot", "effect": "NoSchedule"}]
    api = client.ResourceV1Api(kube)
    created = await api.create_resource_slice(body=body)
    replaced = await api.replace_resource_slice("s", body=created)
    assert replaced.metadata.resource_version == created.metadata.resource_version


async def test_label_only_change_does_not_bump_generation(apiserver, slice_factory):
    created = apiserver.create_object(slice_factory("s"))
    created["metadata"]["labels"] = {"changed": "yes"}
    updated = apiserver.update_object(created)
    assert updated["metadata"]["generation"] == 1
    assert updated["metadata"]["resourceVersion"] != created["metadata"]["resourceVersion"]


@pytest.mark.parametrize(
    ("content_type", "patch"),
    [
        ("application/merge-patch+json", {"metadata": {"labels": {"tier": "gold"}}}),
        ("application/strategic-merge-patch+json", {"metadata": {"labels": {"tier": "gold"}}}),
        (
            "application/json-patch+json",
            [{"op": "add", "path": "/metadata/labels/tier", "value": "gold"}],
        ),
    ],
    ids=["merge", "strategic", "json-patch"],
)
async def test_patch_content_types_add_a_label(http, apiserver, slice_factory, content_type, patch):
    apiserver.create_object(slice_factory("s"))
    headers = {"Content-Type": content_type}
    async with http.patch(f"{SLICES}/s", json=patch, headers=headers) as response:
        assert response.status == 200
        body = await response.json()
    assert body["metadata"]["labels"] == {"driver": "gpu", "tier": "gold"}


async def test_merge_patch_null_removes_a_field(http, apiserver, slice_factory):
    apiserver.create_object(slice_factory("s"))
    headers = {"Content-Type": "application/merge-patch+json"}
    patch = {"metadata": {"labels": {"driver": None}}}
    async with http.patch(f"{SLICES}/s", json=patch, headers=headers) as response:
        assert (
            "labels" not in (await response.json())["metadata"]
            or not (await response.json())["metadata"]["labels"]
        )


async def test_patch_with_unknown_content_type_is_unsupported_media_type(
    http, apiserver, slice_factory
):
    apiserver.create_object(slice_factory("s"))
    async with http.patch(f"{SLICES}/s", data=b"{}", headers={"Content-Type": "text/plain"}) as r:
        assert r.status == 415
        assert (await r.json())["reason"] == "UnsupportedMediaType"


@pytest.mark.parametrize(
    ("preconditions", "status"),
    [({"uid": "wrong"}, 409), ({"resourceVersion": "1"}, 409), ({}, 200)],
    ids=["uid-mismatch", "resource-version-mismatch", "none"],
)
async def test_delete_honours_preconditions(http, apiserver, slice_factory, preconditions, status):
    apiserver.create_object(slice_factory("s"))
    body = {"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": preconditions}
    async with http.delete(f"{SLICES}/s", json=body) as response:
        assert response.status == status
    assert (apiserver.get_object("resourceslices", "s") is None) == (status == 200)


async def test_delete_with_matching_preconditions_returns_the_object(
    http, apiserver, slice_factory
):
    created = apiserver.create_object(slice_factory("s"))
    meta = created["metadata"]
    pre = {"uid": meta["uid"], "resourceVersion": meta["resourceVersion"]}
    async with http.delete(f"{SLICES}/s", json={"preconditions": pre}) as response:
        assert response.status == 200
        assert (await response.json())["metadata"]["uid"] == meta["uid"]


@pytest.mark.parametrize(
    ("selector", "left"),
    [
        ("spec.nodeName=node-1", ["b-node-2", "c-node-2-net"]),
        ("spec.nodeName=node-2,spec.driver=gpu.example.com", ["a-node-1", "c-node-2-net"]),
        ("spec.nodeName==node-2,spec.driver!=gpu.example.com", ["a-node-1", "b-node-2"]),
    ],
    ids=["node", "node-and-driver", "double-equals-and-not-equals"],
)
async def test_deletecollection_removes_only_selected_slices(
    http, apiserver, slice_factory, selector, left
):
    apiserver.create_object(slice_factory("a-node-1", node="node-1"))
    apiserver.create_object(slice_factory("b-node-2", node="node-2"))
    apiserver.create_object(slice_factory("c-node-2-net", node="node-2", driver="net.example.com"))
    async with http.delete(SLICES, params={"fieldSelector": selector}) as response:
        assert response.status == 200
        assert (await response.json())["kind"] == "ResourceSliceList"
    assert [o["metadata"]["name"] for o in apiserver.objects("resourceslices")] == left


async def test_kubernetes_asyncio_deletecollection_by_node(kube, apiserver, slice_factory):
    apiserver.create_object(slice_factory("a", node="node-1"))
    apiserver.create_object(slice_factory("b", node="node-2"))
    api = client.ResourceV1Api(kube)
    await api.delete_collection_resource_slice(field_selector="spec.nodeName=node-1")
    assert [o["metadata"]["name"] for o in apiserver.objects("resourceslices")] == ["b"]


@pytest.mark.parametrize(
    ("params", "names"),
    [
        ({"labelSelector": "driver=gpu"}, ["a"]),
        ({"labelSelector": "driver!=gpu"}, ["b"]),
        ({"labelSelector": "driver in (gpu,net)"}, ["a", "b"]),
        ({"labelSelector": "!driver"}, []),
        ({"fieldSelector": "metadata.name=b"}, ["b"]),
        ({"fieldSelector": "spec.driver=net.example.com"}, ["b"]),
    ],
    ids=["label-equals", "label-not-equals", "label-in", "label-absent", "name", "driver"],
)
async def test_list_filters_by_selectors(http, apiserver, slice_factory, params, names):
    apiserver.create_object(slice_factory("a"))
    apiserver.create_object(slice_factory("b", driver="net.example.com"))
    async with http.get(SLICES, params=params) as response:
        body = await response.json()
    assert body["kind"] == "ResourceSliceList"
    assert body["apiVersion"] == "resource.k8s.io/v1"
    assert body["metadata"]["resourceVersion"]
    assert [i["metadata"]["name"] for i in body["items"]] == names


async def test_unsupported_field_selector_is_a_bad_request(http):
    async with http.get(SLICES, params={"fieldSelector": "spec.pool.name=x"}) as response:
        assert response.status == 400
        assert (await response.json())["reason"] == "BadRequest"


async def test_list_pages_with_limit_and_continue(http, apiserver, slice_factory):
    for name in ("a", "b", "c"):
        apiserver.create_object(slice_factory(name))
    async with http.get(SLICES, params={"limit": "2"}) as response:
        page = await response.json()
    assert [i["metadata"]["name"] for i in page["items"]] == ["a", "b"]
    assert page["metadata"]["remainingItemCount"] == 1
    params = {"limit": "2", "continue": page["metadata"]["continue"]}
    async with http.get(SLICES, params=params) as response:
        rest = await response.json()
    assert [i["metadata"]["name"] for i in rest["items"]] == ["c"]
    assert "continue" not in rest["metadata"]


@pytest.mark.parametrize(
    "path",
    [
        "/apis/resource.k8s.io/v1/namespaces/default/resourceslices",
        "/apis/resource.k8s.io/v1/resourceclaims/claim-1",
        "/apis/resource.k8s.io/v1/resourceslices/s/status",
        "/apis/resource.k8s.io/v1/widgets",
    ],
    ids=["cluster-scoped-under-namespace", "namespaced-without-namespace", "no-status", "unknown"],
)
async def test_wrong_scope_or_unknown_paths_are_not_found(http, path):
    async with http.get(path) as response:
        assert response.status == 404
        assert (await response.json())["kind"] == "Status"


async def test_namespaced_list_across_namespaces(http, apiserver, claim_factory):
    apiserver.create_object(claim_factory("a", namespace="ns-1"))
    apiserver.create_object(claim_factory("b", namespace="ns-2"))
    async with http.get("/apis/resource.k8s.io/v1/resourceclaims") as response:
        assert len((await response.json())["items"]) == 2
    async with http.get("/apis/resource.k8s.io/v1/namespaces/ns-2/resourceclaims") as response:
        assert [i["metadata"]["name"] for i in (await response.json())["items"]] == ["b"]


async def test_claim_status_is_dropped_on_create_and_kept_on_spec_update(http, claim_factory):
    claim = claim_factory("c")
    claim["status"] = {"reservedFor": [{"resource": "pods", "name": "p", "uid": "u1"}]}
    async with http.post(CLAIMS, json=claim) as response:
        created = await response.json()
    assert "status" not in created
    created["status"] = {"reservedFor": [{"resource": "pods", "name": "p", "uid": "u1"}]}
    async with http.put(f"{CLAIMS}/c", json=created) as response:
        assert response.status == 200
        assert "status" not in await response.json()


async def test_status_subresource_changes_only_status(http, apiserver, claim_factory):
    created = apiserver.create_object(claim_factory("c"))
    allocated = dict(created, status={"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": "gpu.example.com", "pool": "node-1", "device": "gpu-0"},
    ]}}})  # fmt: skip
    allocated["metadata"] = dict(created["metadata"], labels={"ignored": "yes"})
    allocated["spec"] = {"devices": {"requests": []}}
    async with http.put(f"{CLAIMS}/c/status", json=allocated) as response:
        assert response.status == 200
        body = await response.json()
    assert body["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-0"
    assert body["spec"] == created["spec"]
    assert "labels" not in body["metadata"]
    assert body["metadata"]["generation"] == 1


async def test_status_merge_patch_through_kubernetes_asyncio(kube, apiserver, claim_factory):
    apiserver.create_object(claim_factory("c"))
    api = client.ResourceV1Api(kube)
    patch = {"status": {"reservedFor": [{"resource": "pods", "name": "p", "uid": "u1"}]}}
    patched = await api.patch_namespaced_resource_claim_status("c", "default", body=patch)
    assert patched.status.reserved_for[0].name == "p"


async def test_claim_spec_is_immutable(http, apiserver, claim_factory):
    created = apiserver.create_object(claim_factory("c"))
    created["spec"]["devices"]["requests"][0]["name"] = "other"
    async with http.put(f"{CLAIMS}/c", json=created) as response:
        status = await response.json()
    assert response.status == 422
    assert {
        "field": "spec",
        "reason": "FieldValueInvalid",
        "message": 'Invalid value: "<object>": field is immutable',
    } in status["details"]["causes"]


async def test_delete_with_finalizer_marks_then_removing_finalizer_deletes(
    http, apiserver, claim_factory
):
    claim = claim_factory("c")
    claim["metadata"]["finalizers"] = ["resource.kubernetes.io/delete-protection"]
    apiserver.create_object(claim)
    async with http.delete(f"{CLAIMS}/c") as response:
        assert response.status == 202
        marked = await response.json()
    assert marked["metadata"]["deletionTimestamp"]
    headers = {"Content-Type": "application/merge-patch+json"}
    async with http.patch(
        f"{CLAIMS}/c", json={"metadata": {"finalizers": None}}, headers=headers
    ) as r:
        assert r.status == 200
    assert apiserver.get_object("resourceclaims", "c", "default") is None


async def test_in_process_reads_return_copies(apiserver, slice_factory):
    apiserver.create_object(slice_factory("s"))
    copy = apiserver.get_object("resourceslices", "s")
    assert copy is not None
    copy["spec"]["devices"].clear()
    assert len(apiserver.objects("resourceslices")[0]["spec"]["devices"]) == 2


async def test_in_process_create_is_validated(apiserver, slice_factory):
    with pytest.raises(APIError) as caught:
        apiserver.create_object(slice_factory("s", devices=129))
    assert caught.value.code == 422


async def test_events_written_as_events_k8s_io_read_as_core(kube, apiserver):
    event = {
        "metadata": {"name": "e1"}, "eventTime": "2026-01-01T00:00:00.000000Z",
        "reportingController": "gpu.example.com/health", "reportingInstance": "node-1",
        "action": "Taint", "reason": "DeviceUnhealthy", "note": "gpu-0 is hot", "type": "Warning",
        "regarding": {"kind": "Node", "name": "node-1"},
    }  # fmt: skip
    body: Any = event  # kubernetes-asyncio accepts plain dicts; its stubs want the model
    await client.EventsV1Api(kube).create_namespaced_event("default", body=body)
    core = await client.CoreV1Api(kube).list_namespaced_event("default")
    assert core.items[0].message == "gpu-0 is hot"
    assert core.items[0].involved_object.name == "node-1"


async def test_bearer_token_is_required_when_configured(tmp_path: Path, slice_factory):
    async with APIServerEmulator(ClusterConfig.for_tests(), token="s3cret") as server:
        async with aiohttp.ClientSession() as session, session.get(server.url + SLICES) as response:
            assert response.status == 401
        configuration = client.Configuration()
        path = server.write_kubeconfig(tmp_path / "kc")
        await config.load_kube_config(config_file=str(path), client_configuration=configuration)
        async with client.ApiClient(configuration) as api:
            await client.ResourceV1Api(api).create_resource_slice(body=slice_factory("s"))
        assert server.get_object("resourceslices", "s") is not None
