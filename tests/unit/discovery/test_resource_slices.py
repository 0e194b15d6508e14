"""Desired ResourceSlices: attribute JSON, names, the pool split, and the write plan."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from services.discovery import slices, syncplan
from shared.pb.drasuite.v1 import inventory_pb2
from shared.sim import profile
from shared.vendors.sim import discovery as sim

DRIVER = "sim.dra-suite.io"
OWNER = slices.Owner("n1", "uid-n1")


def _inventory(devices: list[inventory_pb2.Device], **kwargs: Any) -> inventory_pb2.Inventory:
    return inventory_pb2.Inventory(
        driver=DRIVER, node="n1", pool="n1", backend="sim", devices=devices, **kwargs
    )


def _plain(count: int) -> list[inventory_pb2.Device]:
    return [inventory_pb2.Device(name=f"dev-{i:03d}") for i in range(count)]


def _consuming(name: str) -> inventory_pb2.Device:
    device = inventory_pb2.Device(name=name)
    device.consumes_counters.add(counter_set="mem", counters={"memory": "1Gi"})
    return device


def _stored(objects: list[dict[str, Any]], first: int = 0) -> list[dict[str, Any]]:
    """What the API server would hold after creating `objects`."""
    result = []
    for i, obj in enumerate(objects, start=first):
        stored = copy.deepcopy(obj)
        name = stored["metadata"].pop("generateName", "slice-") + f"{i:05d}"
        stored["metadata"].update(name=name, uid=f"uid-{name}", resourceVersion=str(100 + i))
        result.append(stored)
    return result


def _published(want: slices.DesiredPool) -> list[dict[str, Any]]:
    return _stored(list(syncplan.plan(want, [], owner=OWNER).creates))


# --- attributes and devices ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (inventory_pb2.AttributeValue(int=3), {"int": 3}),
        (inventory_pb2.AttributeValue(int=0), {"int": 0}),
        (inventory_pb2.AttributeValue(bool=False), {"bool": False}),
        (inventory_pb2.AttributeValue(string="910B4"), {"string": "910B4"}),
        (inventory_pb2.AttributeValue(version="1.2.3"), {"version": "1.2.3"}),
    ],
    ids=["int", "int-zero", "bool-false", "string", "version"],
)
def test_attribute_values_serialize_as_the_api_json_union(value, expected):
    assert slices.attribute_json(value) == expected


def test_numa_node_is_an_int_attribute_in_the_driver_domain_for_cel():
    # CEL: device.attributes["sim.dra-suite.io"].numaNode == 0
    npu = sim.to_device(profile.load("mixed").devices[0])
    device = slices.device_json(npu, driver=DRIVER)
    assert device["attributes"]["numaNode"] == {"int": 0}
    assert device["attributes"]["resource.kubernetes.io/pcieRoot"] == {"string": "pci0000:00"}
    assert device["capacity"]["memCapacity"] == {"value": "32Gi"}


@pytest.mark.parametrize(
    ("key", "published"),
    [
        ("numaNode", "numaNode"),
        ("sim.dra-suite.io/numaNode", "numaNode"),
        ("resource.kubernetes.io/pcieRoot", "resource.kubernetes.io/pcieRoot"),
        ("other.example.com/numaNode", "other.example.com/numaNode"),
    ],
    ids=["unqualified", "own-domain-dropped", "standard-stays-qualified", "foreign-domain-kept"],
)
def test_attribute_names_are_canonical_for_the_driver(key, published):
    device = inventory_pb2.Device(name="d")
    device.attributes[key].int = 1
    assert list(slices.device_json(device, driver=DRIVER)["attributes"]) == [published]


def test_device_json_leaves_empty_fields_out():
    assert slices.device_json(inventory_pb2.Device(name="d"), driver=DRIVER) == {"name": "d"}


def test_consumed_counters_serialize_as_quantity_values():
    device = slices.device_json(_consuming("p-0"), driver=DRIVER)
    assert device["consumesCounters"] == [
        {"counterSet": "mem", "counters": {"memory": {"value": "1Gi"}}}
    ]


# --- names --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("node", "index", "count", "expected"),
    [
        ("n1", 0, 1, "00000-sim.dra-suite.io-n1-"),
        ("n1", 26, 27, "0001a-sim.dra-suite.io-n1-"),
        ("n1", 3, 0x100001, "000003-sim.dra-suite.io-n1-"),
        ("a" * 60, 0, 1, ("00000-sim.dra-suite.io-" + "a" * 60)[:58]),
    ],
    ids=["first", "hex", "wider-for-a-huge-pool", "long-node-cut-to-58"],
)
def test_generate_name_is_hex_index_then_driver_then_node(node, index, count, expected):
    assert slices.generate_name(node, DRIVER, index=index, count=count) == expected


@pytest.mark.parametrize(
    ("name", "index"),
    [
        ("00000-sim.dra-suite.io-n1-abcde", 0),
        ("0001a-sim.dra-suite.io-n1-abcde", 26),
        ("000003-sim.dra-suite.io-n1-x", 3),
        ("n1-sim.dra-suite.io-abcde", None),
        ("cafe1-n1-sim.dra-suite.io-x", None),
        ("00000-other.example.com-n1-abcde", None),
        ("0001-sim.dra-suite.io-n1-abcde", None),
    ],
    ids=["first", "hex", "wide", "v035-name", "hex-looking-node", "other-driver", "too-short"],
)
def test_slice_index_reads_only_v036_names_of_this_driver(name, index):
    assert slices.slice_index(name, driver=DRIVER) == index


# --- desired pool and split ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("devices", "sizes"),
    [
        (_plain(0), []),
        (_plain(1), [1]),
        (_plain(128), [128]),
        (_plain(129), [128, 1]),
        (_plain(300), [128, 128, 44]),
        ([_consuming(f"p-{i:03d}") for i in range(64)], [64]),
        ([_consuming(f"p-{i:03d}") for i in range(65)], [64, 1]),
        ([*_plain(100), _consuming("zz-0")], [100, 1]),
    ],
    ids=["empty", "one", "128", "129", "300", "64-consuming", "65-consuming", "mixed"],
)
def test_pool_is_split_within_the_per_slice_device_limits(devices, sizes):
    counters = [inventory_pb2.CounterSet(name="mem", counters={"memory": "64Gi"})]
    want = slices.desired(_inventory(devices, shared_counters=counters))
    device_slices = [c for c in want.contents if "devices" in c]
    assert [len(c["devices"]) for c in device_slices] == sizes


def test_devices_with_taints_use_the_lower_limit():
    taints = {f"dev-{i:03d}": [{"key": "k", "effect": "NoSchedule"}] for i in range(2)}
    want = slices.desired(_inventory(_plain(100)), taints=taints)
    assert [len(c["devices"]) for c in want.contents] == [64, 36]


def test_shared_counters_get_slices_of_their_own():
    names = ["mem", *(f"set-{i}" for i in range(8))]
    counters = [inventory_pb2.CounterSet(name=n, counters={"memory": "1Gi"}) for n in names]
    want = slices.desired(_inventory([_consuming("p-0")], shared_counters=counters))
    assert [len(c.get("sharedCounters", [])) for c in want.contents] == [8, 1, 0]
    assert [len(c.get("devices", [])) for c in want.contents] == [0, 0, 1]
    assert not want.rejected


def test_an_empty_pool_still_publishes_one_empty_slice():
    want = slices.desired(_inventory([]))
    assert want.contents == ({"devices": []},)
    (created,) = syncplan.plan(want, [], owner=OWNER).creates
    assert created["spec"]["pool"]["resourceSliceCount"] == 1


def test_a_bad_device_is_rejected_and_the_rest_is_published():
    bad = inventory_pb2.Device(name="bad")
    bad.attributes["model"].string = "x" * 65
    want = slices.desired(_inventory([*_plain(2), bad]))
    assert [d["name"] for d in want.contents[0]["devices"]] == ["dev-000", "dev-001"]
    (rejection,) = want.rejected
    assert rejection.name == "bad"
    assert "longer than 64 bytes" in rejection.problems[0]
    assert rejection.reason == "invalid"


def test_consuming_an_unknown_counter_set_rejects_the_device():
    want = slices.desired(_inventory([_consuming("p-0")]))
    assert want.rejected[0].problems == ("consumesCounters 'mem': no such counter set in the pool",)


def test_duplicate_device_names_keep_the_first():
    want = slices.desired(_inventory([*_plain(1), *_plain(1)]))
    assert len(want.contents[0]["devices"]) == 1
    assert want.rejected[0].problems == ("duplicate device name in the pool",)
    assert want.rejected[0].reason == "duplicate"


def test_spec_names_driver_node_and_pool_with_generation_and_count():
    want = slices.desired(_inventory(_plain(129)))
    spec = want.spec(want.contents[1], generation=4)
    assert spec["driver"] == DRIVER
    assert spec["nodeName"] == "n1"
    assert spec["pool"] == {"name": "n1", "generation": 4, "resourceSliceCount": 2}


# --- plan ---------------------------------------------------------------------------------


def test_first_publish_creates_every_slice_at_generation_one_owned_by_the_node():
    plan = syncplan.plan(slices.desired(_inventory(_plain(200))), [], owner=OWNER)
    assert (plan.generation, len(plan.creates), plan.updates, plan.deletes) == (1, 2, (), ())
    created = plan.creates[0]
    assert created["apiVersion"] == "resource.k8s.io/v1"
    assert created["metadata"]["generateName"] == "00000-sim.dra-suite.io-n1-"
    assert plan.creates[1]["metadata"]["generateName"] == "00001-sim.dra-suite.io-n1-"
    assert created["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "uid-n1", "controller": True}
    ]


def test_unchanged_pool_plans_no_writes():
    want = slices.desired(_inventory(_plain(200)))
    plan = syncplan.plan(want, _published(want), owner=OWNER)
    assert plan.empty
    assert plan.generation == 1


def test_server_set_fields_do_not_count_as_changes():
    want = slices.desired(_inventory(_plain(3)))
    actual = _published(want)
    actual[0]["metadata"]["creationTimestamp"] = "2025-01-01T00:00:00Z"
    actual[0]["metadata"]["managedFields"] = [{"manager": "x"}]
    actual[0]["spec"]["devices"][0]["attributes"] = {}
    assert syncplan.plan(want, actual, owner=OWNER).empty


# Generation rule of the Go helper (resourceslicecontroller.go, syncPool): keep it when no
# slice is created and at most one changes; else bump it and rewrite every slice.


def test_a_change_within_one_slice_updates_only_it_and_keeps_the_generation():
    actual = _published(slices.desired(_inventory(_plain(200))))
    plan = syncplan.plan(slices.desired(_inventory(_plain(201))), actual, owner=OWNER)
    assert (plan.changed, plan.bumped, plan.generation) == (True, False, 1)
    (update,) = plan.updates
    assert (plan.creates, plan.deletes) == ((), ())
    # The slice holding the new device, under its name and resourceVersion (optimistic locking).
    assert update["metadata"]["name"] == actual[1]["metadata"]["name"]
    assert update["metadata"]["resourceVersion"] == "101"
    assert update["spec"]["pool"] == {"name": "n1", "generation": 1, "resourceSliceCount": 2}


def test_devices_moving_between_slices_bump_the_generation_and_rewrite_every_slice():
    actual = _published(slices.desired(_inventory(_plain(200))))
    plan = syncplan.plan(slices.desired(_inventory(_plain(201)[1:])), actual, owner=OWNER)
    assert (plan.bumped, plan.generation, len(plan.updates), plan.creates) == (True, 2, 2, ())
    assert all(u["spec"]["pool"]["generation"] == 2 for u in plan.updates)
    assert {u["metadata"]["resourceVersion"] for u in plan.updates} == {"100", "101"}


def test_an_unchanged_slice_is_rewritten_too_when_the_generation_is_bumped():
    actual = _published(slices.desired(_inventory(_plain(300))))  # 128 + 128 + 44
    changed = _plain(300)
    changed[0].attributes["x"].int = 1
    changed[200].attributes["x"].int = 1
    plan = syncplan.plan(slices.desired(_inventory(changed)), actual, owner=OWNER)
    assert (plan.bumped, len(plan.updates)) == (True, 3)


def test_growing_past_a_slice_creates_one_and_bumps_generation():
    actual = _published(slices.desired(_inventory(_plain(128))))
    plan = syncplan.plan(slices.desired(_inventory(_plain(129))), actual, owner=OWNER)
    assert (plan.generation, len(plan.updates), len(plan.creates)) == (2, 1, 1)
    assert {o["spec"]["pool"]["resourceSliceCount"] for o in plan.updates + plan.creates} == {2}


def test_a_new_slice_bumps_the_generation_even_when_nothing_else_changes():
    actual = _published(slices.desired(_inventory(_plain(129))))
    wiped = [actual[0]]  # slice 2 deleted by someone: it must be created again
    plan = syncplan.plan(slices.desired(_inventory(_plain(129))), wiped, owner=OWNER)
    assert (plan.bumped, plan.generation, len(plan.updates), len(plan.creates)) == (
        True,
        2,
        1,
        1,
    )


def test_shrinking_deletes_the_extra_slice_first_and_keeps_the_generation():
    actual = _published(slices.desired(_inventory(_plain(129))))
    plan = syncplan.plan(slices.desired(_inventory(_plain(10))), actual, owner=OWNER)
    assert (plan.generation, plan.bumped, len(plan.updates), len(plan.deletes)) == (1, False, 1, 1)
    assert plan.updates[0]["spec"]["pool"]["resourceSliceCount"] == 1
    assert plan.deletes[0]["metadata"]["name"] != plan.updates[0]["metadata"]["name"]


def test_shrinking_two_changed_slices_bumps_the_generation():
    actual = _published(slices.desired(_inventory(_plain(300))))
    plan = syncplan.plan(slices.desired(_inventory(_plain(200))), actual, owner=OWNER)
    assert (plan.bumped, plan.generation, len(plan.updates), len(plan.deletes)) == (True, 2, 2, 1)


def test_a_floor_above_the_current_generation_bumps_past_it():
    actual = _published(slices.desired(_inventory(_plain(3))))
    plan = syncplan.plan(slices.desired(_inventory(_plain(4))), actual, owner=OWNER, floor=7)
    assert (plan.bumped, plan.generation) == (True, 8)


def test_deleted_slice_is_recreated_with_a_generation_above_the_floor():
    want = slices.desired(_inventory(_plain(3)))
    plan = syncplan.plan(want, [], owner=OWNER, floor=5)
    assert plan.generation == 6
    assert len(plan.creates) == 1


def test_older_generations_and_other_pools_are_deleted_without_a_bump():
    want = slices.desired(_inventory(_plain(3)))
    current = _published(want)
    stale = _stored(list(syncplan.plan(want, [], owner=OWNER).creates), first=7)
    stale[0]["spec"]["pool"]["generation"] = 0
    other = _stored(list(syncplan.plan(want, [], owner=OWNER).creates), first=8)
    other[0]["spec"]["pool"]["name"] = "old-pool"
    plan = syncplan.plan(want, current + stale + other, owner=OWNER)
    assert plan.generation == 1
    assert not plan.changed
    assert {d["metadata"]["name"] for d in plan.deletes} == {
        stale[0]["metadata"]["name"],
        other[0]["metadata"]["name"],
    }


def test_higher_generation_found_in_the_cluster_is_continued():
    want = slices.desired(_inventory(_plain(3)))
    actual = _published(want)
    actual[0]["spec"]["pool"]["generation"] = 41
    plan = syncplan.plan(slices.desired(_inventory(_plain(4))), actual, owner=OWNER)
    assert plan.generation == 41  # one slice changes: kept
    grown = syncplan.plan(slices.desired(_inventory(_plain(129))), actual, owner=OWNER)
    assert grown.generation == 42


def test_adopted_server_form_counts_as_equal():
    # We sent a device with consumesCounters; the server (gate off) stored it without them.
    want = slices.desired(_inventory(_plain(1)))
    (stored,) = _published(want)
    sent = copy.deepcopy(stored["spec"])
    sent["devices"][0]["consumesCounters"] = [{"counterSet": "mem", "counters": {}}]
    assert not syncplan.same_spec(stored, sent)
    adopted = {
        stored["metadata"]["name"]: (slices.fingerprint(sent), slices.fingerprint(stored["spec"]))
    }
    assert syncplan.same_spec(stored, sent, adopted=adopted)


def test_server_set_taint_time_added_is_not_a_change():
    taints = {"dev-000": [{"key": "k", "value": "v", "effect": "NoSchedule"}]}
    want = slices.desired(_inventory(_plain(1)), taints=taints)
    actual = _published(want)
    actual[0]["spec"]["devices"][0]["taints"][0]["timeAdded"] = "2025-01-01T00:00:00Z"
    assert syncplan.plan(want, actual, owner=OWNER).empty


@pytest.mark.parametrize(
    ("stored", "equal"),
    [
        ("2025-01-01T00:00:00Z", True),
        ("2025-01-01T00:00:01Z", True),
        ("2025-01-01T00:00:02Z", False),
    ],
    ids=["same", "within-a-second", "two-seconds-off"],
)
def test_taint_times_within_a_second_are_equal(stored, equal):
    taint = {"key": "k", "effect": "NoSchedule", "timeAdded": "2025-01-01T00:00:00Z"}
    want = slices.desired(_inventory(_plain(1)), taints={"dev-000": [taint]})
    actual = _published(want)
    actual[0]["spec"]["devices"][0]["taints"][0]["timeAdded"] = stored
    assert syncplan.plan(want, actual, owner=OWNER).empty is equal


def test_an_update_keeps_the_time_added_of_taints_that_stay():
    kept = {"key": "k", "effect": "NoSchedule"}
    want = slices.desired(_inventory(_plain(2)), taints={"dev-000": [kept]})
    actual = _published(want)
    actual[0]["spec"]["devices"][0]["taints"][0]["timeAdded"] = "2025-01-01T00:00:00Z"
    new = {"key": "other", "effect": "NoExecute"}
    changed = slices.desired(_inventory(_plain(2)), taints={"dev-000": [kept], "dev-001": [new]})
    (update,) = syncplan.plan(changed, actual, owner=OWNER).updates
    devices = update["spec"]["devices"]
    assert devices[0]["taints"] == [{**kept, "timeAdded": "2025-01-01T00:00:00Z"}]
    assert devices[1]["taints"] == [new]  # the server sets the time of a new taint


def test_rejected_contents_are_left_out_of_the_pool():
    want = slices.desired(_inventory(_plain(200)))
    rejected = {slices.content_id(want.contents[1])}
    kept = want.without(rejected)
    assert kept.contents == want.contents[:1]
    assert kept.spec(kept.contents[0], generation=1)["pool"]["resourceSliceCount"] == 1


def test_a_wholly_rejected_pool_becomes_one_empty_slice():
    want = slices.desired(_inventory(_plain(3)))
    assert want.without({slices.content_id(want.contents[0])}).contents == ({"devices": []},)


def test_content_of_drops_driver_node_and_pool():
    want = slices.desired(_inventory(_plain(1)))
    spec = want.spec(want.contents[0], generation=3)
    assert slices.content_of(spec) == want.contents[0]


# --- v0.36 names and adoption of older names -------------------------------------------------


def _renamed(objects: list[dict[str, Any]], names: list[str]) -> list[dict[str, Any]]:
    for obj, name in zip(objects, names, strict=True):
        obj["metadata"]["name"] = name
    return objects


def test_slices_named_by_an_older_agent_are_adopted_without_writes():
    want = slices.desired(_inventory(_plain(200)))
    old = _renamed(_published(want), ["n1-sim.dra-suite.io-zzzzz", "n1-sim.dra-suite.io-aaaaa"])
    assert syncplan.plan(want, old, owner=OWNER).empty


def test_a_change_updates_slices_under_their_old_names():
    old = _renamed(
        _published(slices.desired(_inventory(_plain(200)))),
        ["n1-sim.dra-suite.io-zzzzz", "n1-sim.dra-suite.io-aaaaa"],
    )
    plan = syncplan.plan(slices.desired(_inventory(_plain(256)[56:])), old, owner=OWNER)
    assert (len(plan.updates), plan.creates, plan.deletes) == (2, (), ())
    assert {u["metadata"]["name"] for u in plan.updates} == {o["metadata"]["name"] for o in old}


def test_a_new_slice_is_named_by_its_index_in_the_pool():
    old = _renamed(_published(slices.desired(_inventory(_plain(128)))), ["n1-sim.dra-suite.io-q"])
    plan = syncplan.plan(slices.desired(_inventory(_plain(129))), old, owner=OWNER)
    (created,) = plan.creates
    assert created["metadata"]["generateName"] == "00001-sim.dra-suite.io-n1-"


def test_changed_slices_are_matched_by_their_index_prefix_before_name_order():
    actual = _renamed(
        _published(slices.desired(_inventory(_plain(200)))),
        ["n1-sim.dra-suite.io-xxxxx", "00001-sim.dra-suite.io-n1-yyyyy"],
    )
    changed = slices.desired(_inventory(_plain(201)[1:]))  # both slices change their devices
    plan = syncplan.plan(changed, actual, owner=OWNER)
    first = {u["metadata"]["name"]: u["spec"]["devices"][0]["name"] for u in plan.updates}
    assert first == {
        "n1-sim.dra-suite.io-xxxxx": "dev-001",
        "00001-sim.dra-suite.io-n1-yyyyy": "dev-129",
    }
