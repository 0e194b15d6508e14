"""Fields a server dropped from a written slice, and the feature gates they point to."""

from __future__ import annotations

import pytest

from services.discovery import dropped

COUNTERS = {"counterSet": "gpu-0-counter-set", "counters": {"memory": {"value": "1Gi"}}}


@pytest.mark.parametrize(
    ("sent", "stored", "paths", "gates"),
    [
        (
            {"sharedCounters": [{"name": "s", "counters": {"c": {"value": "1"}}}]},
            {},
            ["sharedCounters"],
            ["DRAPartitionableDevices"],
        ),
        (
            {"devices": [{"name": "d", "consumesCounters": [COUNTERS]}]},
            {"devices": [{"name": "d"}]},
            ["devices[].consumesCounters"],
            ["DRAPartitionableDevices"],
        ),
        (
            {"devices": [{"name": "d", "taints": [{"key": "k", "effect": "NoSchedule"}]}]},
            {"devices": [{"name": "d"}]},
            ["devices[].taints"],
            ["DRADeviceTaints"],
        ),
        (
            {"devices": [{"name": "d", "capacity": {"m": {"value": "1", "requestPolicy": {}}}}]},
            {"devices": [{"name": "d", "capacity": {"m": {"value": "1"}}}]},
            [],
            [],
        ),
        (
            {
                "devices": [
                    {
                        "name": "d",
                        "allowMultipleAllocations": True,
                        "capacity": {"m": {"value": "1", "requestPolicy": {"default": "1"}}},
                    }
                ]
            },
            {"devices": [{"name": "d", "capacity": {"m": {"value": "1"}}}]},
            ["devices[].allowMultipleAllocations", "devices[].capacity{}.requestPolicy"],
            ["DRAConsumableCapacity"],
        ),
        (
            {"devices": [{"name": "d", "attributes": {"a": {"ints": [1, 2]}}}]},
            {"devices": [{"name": "d", "attributes": {"a": {}}}]},
            ["devices[].attributes{}.ints"],
            ["DRAListTypeAttributes"],
        ),
        (
            {"devices": [{"name": "d", "taints": [{"key": "k", "effect": "NoSchedule"}]}]},
            {
                "devices": [
                    {
                        "name": "d",
                        "taints": [
                            {
                                "key": "k",
                                "effect": "NoSchedule",
                                "timeAdded": "2026-01-01T00:00:00Z",
                            }
                        ],
                    }
                ]
            },
            [],
            [],
        ),
        (
            {"devices": [{"name": "d", "mystery": 1}]},
            {"devices": [{"name": "d"}]},
            ["devices[].mystery"],
            [],
        ),
    ],
    ids=[
        "shared-counters",
        "consumes-counters",
        "taints",
        "empty-field-is-no-drop",
        "consumable-capacity",
        "list-attributes",
        "server-added-time-is-no-drop",
        "unknown-field-names-no-gate",
    ],
)
def test_dropped_fields_name_the_gates_that_guard_them(sent, stored, paths, gates):
    found = dropped.dropped_paths({"spec": sent}, {"spec": stored})
    assert found == [f"spec.{p}" for p in paths]
    assert dropped.likely_gates(found) == gates


def test_the_event_message_lists_fields_and_gates():
    text = dropped.message(
        slice_name="s1", paths=["sharedCounters"], gates=["DRAPartitionableDevices"]
    )
    assert text == (
        "The API server dropped spec.sharedCounters of ResourceSlice s1; "
        "likely feature gates off: DRAPartitionableDevices"
    )
