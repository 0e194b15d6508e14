"""Device taints from health records: validation, JSON, the node's view, and their slices."""

from __future__ import annotations

from typing import Any

import pytest

from services.discovery import apirules, slices, syncplan, taints
from shared.bus import codec
from shared.bus.kv import KVChange
from shared.pb.drasuite.v1 import health_pb2, inventory_pb2

DRIVER = "sim.dra-suite.io"
NODE = "n1"
PREFIX = "sim_dra-suite_io.n1."
OWNER = slices.Owner(NODE, "uid-n1")


def _taint(
    key: str = "sim.dra-suite.io/unhealthy",
    effect: str = "NoSchedule",
    value: str = "",
    at_ms: int = 0,
) -> health_pb2.DeviceTaint:
    return health_pb2.DeviceTaint(key=key, value=value, effect=effect, time_added_unix_ms=at_ms)


def _record(
    device: str, *found: health_pb2.DeviceTaint, node: str = NODE, updated_unix_ms: int = 0
) -> bytes:
    record = health_pb2.DeviceHealth(
        driver=DRIVER,
        node=node,
        device=device,
        updated_unix_ms=updated_unix_ms,
        taints=list(found),
    )
    return codec.encode(record)


def _put(device: str, value: bytes | None) -> KVChange:
    return KVChange(key=PREFIX + device, value=value, revision=1)


_SYNCED = KVChange(key="", value=None, revision=0, synced=True)


def _listed(board: taints.DeviceTaints) -> taints.DeviceTaints:
    board.apply(_SYNCED, prefix=PREFIX)
    return board


def _board() -> taints.DeviceTaints:
    return _listed(taints.DeviceTaints(driver=DRIVER, node=NODE))


# --- one taint --------------------------------------------------------------------------------


def test_a_taint_is_published_as_the_api_json_with_its_time_in_seconds():
    taint = _taint(value="xid-79", effect="NoExecute", at_ms=1_735_689_600_999)
    assert taints.taint_json(taint) == {
        "key": "sim.dra-suite.io/unhealthy",
        "value": "xid-79",
        "effect": "NoExecute",
        "timeAdded": "2025-01-01T00:00:00Z",
    }


def test_empty_value_and_unknown_time_are_left_out_as_the_api_serves_them():
    assert taints.taint_json(_taint()) == {
        "key": "sim.dra-suite.io/unhealthy",
        "effect": "NoSchedule",
    }


@pytest.mark.parametrize(
    ("taint", "problem"),
    [
        (_taint(key="unhealthy"), ""),
        (_taint(key="example.com/a.b_c-d", value="A-1.b_2", effect="None"), ""),
        (_taint(key=""), "key ''"),
        (_taint(key="a/b/c"), "prefix must be a DNS subdomain"),
        (_taint(key="Example.com/x"), "prefix must be a DNS subdomain"),
        (_taint(key="x" * 64), "name part must be 1-63"),
        (_taint(value="x" * 64), "is not a label value"),
        (_taint(value="-x"), "is not a label value"),
        (_taint(effect=""), "effect '' is not one of"),
        (_taint(effect="PreferNoSchedule"), "effect 'PreferNoSchedule' is not one of"),
        (_taint(at_ms=253402300799999), ""),
        (_taint(at_ms=2**63 - 1), "past the year 9999"),
    ],
    ids=[
        "plain-key",
        "qualified",
        "empty-key",
        "two-slashes",
        "upper-case-prefix",
        "long-name",
        "long-value",
        "value-starts-with-dash",
        "no-effect",
        "unknown-effect",
        "last-time",
        "time-past-9999",
    ],
)
def test_taints_are_checked_like_the_api_server_does(taint, problem):
    found = taints.taint_problem(taint)
    assert (problem in found and bool(found)) if problem else found == ""


def test_a_record_keeps_its_good_taints_strongest_first_without_duplicates():
    record = health_pb2.DeviceHealth(
        taints=[
            _taint(key="b", effect="NoSchedule"),
            _taint(key="bad key", effect="NoSchedule"),
            _taint(key="a", effect="None"),
            _taint(key="c", effect="NoExecute"),
            _taint(key="b", effect="NoSchedule"),
        ]
    )
    kept, problems = taints.taints_of(record)
    assert [(t["key"], t["effect"]) for t in kept] == [
        ("c", "NoExecute"),
        ("b", "NoSchedule"),
        ("a", "None"),
    ]
    assert len(problems) == 1


# --- the node's view ------------------------------------------------------------------------


def test_a_record_with_taints_taints_its_device_and_a_clear_one_lifts_them():
    board = _board()
    board.apply(_put("npu-3", _record("npu-3", _taint())), prefix=PREFIX)
    assert dict(board.current()) == {
        "npu-3": ({"key": "sim.dra-suite.io/unhealthy", "effect": "NoSchedule"},)
    }
    board.apply(_put("npu-3", _record("npu-3")), prefix=PREFIX)
    assert dict(board.current()) == {}


def test_a_deleted_record_lifts_the_taints():
    board = _board()
    board.apply(_put("npu-3", _record("npu-3", _taint())), prefix=PREFIX)
    board.apply(_put("npu-3", None), prefix=PREFIX)
    assert dict(board.current()) == {}


def test_a_refreshed_record_with_the_same_taints_is_no_change():
    board = _board()
    board.apply(_put("npu-3", _record("npu-3", _taint(), updated_unix_ms=1)), prefix=PREFIX)
    version = board.version
    board.apply(_put("npu-3", _record("npu-3", _taint(), updated_unix_ms=2)), prefix=PREFIX)
    assert board.version == version


@pytest.mark.parametrize(
    "value",
    [b"\xff\x00garbage", _record("npu-4", _taint()), _record("npu-3", _taint(), node="n2")],
    ids=["undecodable", "other-device", "other-node"],
)
def test_a_malformed_record_is_ignored_and_keeps_what_the_device_had(value):
    board = _board()
    board.apply(_put("npu-3", _record("npu-3", _taint())), prefix=PREFIX)
    before = dict(board.current())
    board.apply(_put("npu-3", value), prefix=PREFIX)
    assert dict(board.current()) == before
    # It also survives a relisting: the key exists, so its device keeps its taints.
    board.apply(_put("npu-3", value), prefix=PREFIX, epoch=1)
    board.apply(_SYNCED, prefix=PREFIX, epoch=1)
    assert dict(board.current()) == before


def test_seeded_taints_stay_until_the_first_listing_ends():
    board = taints.DeviceTaints(driver=DRIVER, node=NODE)
    published = {
        "npu-1": ({"key": "k", "effect": "NoSchedule"},),
        "npu-2": ({"key": "k", "effect": "NoSchedule"},),
    }
    board.seed(published)
    assert not board.listed
    board.apply(_put("npu-2", _record("npu-2", _taint(key="k"))), prefix=PREFIX)
    assert set(board.current()) == {"npu-1", "npu-2"}  # npu-1 not confirmed yet, kept
    board.apply(_SYNCED, prefix=PREFIX)
    assert set(board.current()) == {"npu-2"}
    board.seed(published)  # too late: the KV has been listed
    assert set(board.current()) == {"npu-2"}


def test_seeding_never_overrides_a_record_already_read():
    board = taints.DeviceTaints(driver=DRIVER, node=NODE)
    board.apply(_put("npu-2", _record("npu-2")), prefix=PREFIX)
    board.seed({"npu-2": ({"key": "old", "effect": "NoSchedule"},)})
    assert dict(board.current()) == {}


def test_a_relisting_after_a_reconnect_drops_records_deleted_meanwhile():
    board = _board()
    board.apply(_put("npu-1", _record("npu-1", _taint())), prefix=PREFIX)
    board.apply(_put("npu-2", _record("npu-2", _taint())), prefix=PREFIX)
    # Reconnected (new epoch): the replay lists npu-2 only; npu-1 was deleted while away.
    board.apply(_put("npu-2", _record("npu-2", _taint())), prefix=PREFIX, epoch=1)
    board.apply(_SYNCED, prefix=PREFIX, epoch=1)
    assert set(board.current()) == {"npu-2"}


async def test_next_wakes_on_a_real_change_only():
    board = _board()
    version = board.version
    board.apply(_put("npu-3", _record("npu-3", _taint())), prefix=PREFIX)
    assert await board.next(after=version) == version + 1


# --- taints in the slices -------------------------------------------------------------------


def _plain(count: int) -> inventory_pb2.Inventory:
    devices = [inventory_pb2.Device(name=f"dev-{i:03d}") for i in range(count)]
    return inventory_pb2.Inventory(driver=DRIVER, node=NODE, pool=NODE, devices=devices)


def test_a_taintable_pool_keeps_to_the_lower_device_limit_from_the_start():
    want = slices.desired(_plain(100), taintable=True)
    assert [len(c["devices"]) for c in want.contents] == [64, 36]


def test_a_taintable_pool_is_laid_out_normally_when_the_server_drops_taints():
    rules = apirules.for_minor(36).without(["DRADeviceTaints"])
    want = slices.desired(_plain(100), taintable=True, rules=rules)
    assert [len(c["devices"]) for c in want.contents] == [100]


def _published(want: slices.DesiredPool) -> list[dict[str, Any]]:
    result = []
    for i, obj in enumerate(syncplan.plan(want, [], owner=OWNER).creates):
        name = f"{obj['metadata']['generateName']}{i:05d}"
        result.append({**obj, "metadata": {**obj["metadata"], "name": name}})
    return result


def test_a_taint_rewrites_only_the_slice_of_its_device_and_keeps_the_generation():
    actual = _published(slices.desired(_plain(200), taintable=True))
    taint = {"dev-150": ({"key": "k", "effect": "NoSchedule"},)}
    plan = syncplan.plan(
        slices.desired(_plain(200), taints=taint, taintable=True), actual, owner=OWNER
    )
    (update,) = plan.updates
    assert (plan.generation, plan.creates, plan.deletes) == (1, (), ())
    assert update["metadata"]["name"] == actual[2]["metadata"]["name"]
    tainted = [d for d in update["spec"]["devices"] if d.get("taints")]
    assert [d["name"] for d in tainted] == ["dev-150"]


@pytest.mark.parametrize(
    ("minor", "published"), [(34, ["NoSchedule"]), (35, ["NoSchedule", "None"])]
)
def test_the_none_effect_is_published_only_where_the_server_allows_it(minor, published):
    found = {"dev-000": ({"key": "a", "effect": "NoSchedule"}, {"key": "b", "effect": "None"})}
    want = slices.desired(_plain(1), taints=found, rules=apirules.for_minor(minor))
    assert [t["effect"] for t in want.contents[0]["devices"][0]["taints"]] == published


def test_taints_beyond_the_servers_limit_keep_the_strongest():
    weak = [{"key": f"k{i}", "effect": "None"} for i in range(4)]
    many = (*weak, {"key": "z", "effect": "NoExecute"})
    want = slices.desired(_plain(1), taints={"dev-000": many}, rules=apirules.for_minor(34))
    assert [t["key"] for t in want.contents[0]["devices"][0]["taints"]] == ["z"]
    want = slices.desired(_plain(1), taints={"dev-000": many}, rules=apirules.for_minor(35))
    assert want.contents[0]["devices"][0]["taints"][0]["key"] == "z"
