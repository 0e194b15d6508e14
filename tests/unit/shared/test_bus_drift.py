"""Stream drift: which settings differ, whether NATS changes them in place, the update that
keeps every other field, and the `nats` command an operator runs instead."""

from __future__ import annotations

import pytest
from nats.js import api

from shared.bus import drift
from shared.config import NATSSettings
from shared.errors import ConfigError


def _alerts(**overrides: object) -> api.StreamConfig:
    config = api.StreamConfig(
        name="DRA_ALERTS",
        subjects=["dra.alerts.>"],
        max_age=86400.0,
        duplicate_window=120.0,
        storage=api.StorageType.FILE,
        num_replicas=1,
        max_msgs=1000,
    )
    for field, value in overrides.items():
        setattr(config, field, value)
    return config


def test_equal_settings_are_no_drift() -> None:
    wanted = {"subjects": ["dra.alerts.>"], "max_age": 86400, "num_replicas": 1}
    assert not drift.drift(_alerts(), wanted)


def test_more_replicas_are_updated_in_place_and_nothing_else_changes() -> None:
    found = drift.drift(_alerts(), {"num_replicas": 3, "duplicate_window": 120.0})
    assert found.in_place
    assert found.summary() == {"num_replicas": "1 -> 3"}
    updated = found.updated(_alerts())
    assert updated.num_replicas == 3
    assert updated.max_msgs == 1000  # untouched fields stay as the server has them
    assert found.command() == "nats stream edit DRA_ALERTS --replicas 3 --force"


def test_the_command_names_every_changed_setting() -> None:
    found = drift.drift(
        _alerts(), {"max_age": 3600.0, "subjects": ["b.>", "a.>"], "allow_direct": True}
    )
    assert found.command() == (
        "nats stream edit DRA_ALERTS --allow-direct --max-age 3600s --subjects b.>,a.> --force"
    )


def test_fewer_replicas_never_shrink_a_stream() -> None:
    assert not drift.drift(_alerts(num_replicas=3), {"num_replicas": 1})


def test_an_unset_consumer_limit_is_the_servers_default_and_is_raised() -> None:
    found = drift.drift(_alerts(max_consumers=-1), {"max_consumers": 1_000_000})
    assert found.summary() == {"max_consumers": "-1 -> 1000000"}
    assert found.command() == "nats stream edit DRA_ALERTS --max-consumers 1000000 --force"
    assert not drift.drift(_alerts(max_consumers=2_000_000), {"max_consumers": 1_000_000})


def test_another_storage_type_cannot_be_changed_in_place() -> None:
    found = drift.drift(_alerts(), {"storage": api.StorageType.MEMORY, "num_replicas": 3})
    assert found
    assert not found.in_place
    assert found.updated(_alerts()).storage == api.StorageType.FILE


@pytest.mark.parametrize("replicas", [0, 6, -1], ids=["zero", "above-five", "negative"])
def test_replicas_outside_one_to_five_are_a_config_error(replicas: int) -> None:
    with pytest.raises(ConfigError, match="nats replicas"):
        NATSSettings(replicas=replicas)


def test_replicas_default_to_one_server() -> None:
    assert NATSSettings().replicas == 1
