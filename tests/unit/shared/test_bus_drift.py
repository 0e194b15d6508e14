"""Stream drift: every field of the config the server reports against the provisioned one,
whether NATS changes them in place, the config to update to, and the `nats` command."""

from __future__ import annotations

from typing import Any

import pytest

from shared.bus import drift, streams
from shared.config import NATSSettings
from shared.errors import ConfigError


def _alerts(**overrides: object) -> dict[str, Any]:
    return {**streams.alerts_stream("DRA_ALERTS", ["dra.alerts.>"], replicas=1), **overrides}


def _as_reported(config: dict[str, Any]) -> dict[str, Any]:
    """What the server answers: its own metadata added."""
    server = {"_nats.level": "1", "_nats.ver": "2.15.1"}
    return {**config, "metadata": {**config.get("metadata", {}), **server}}


def test_the_provisioned_config_as_reported_is_no_drift() -> None:
    assert not drift.drift(_as_reported(_alerts()), _alerts())


def test_more_replicas_are_updated_in_place_and_nothing_else_changes() -> None:
    found = drift.drift(_alerts(), _alerts(num_replicas=3))
    assert found.in_place
    assert found.summary() == {"num_replicas": "1 -> 3"}
    assert found.target == _alerts(num_replicas=3)
    assert found.command() == "nats stream edit DRA_ALERTS --replicas 3 --force"


def test_fewer_replicas_never_shrink_a_stream_and_the_update_keeps_them() -> None:
    assert not drift.drift(_alerts(num_replicas=3), _alerts())
    found = drift.drift(_alerts(num_replicas=3, deny_purge=False), _alerts())
    assert found.target["num_replicas"] == 3


@pytest.mark.parametrize(
    "field",
    [
        {"subject_transform": {"src": "$KV.b.a", "dest": "$KV.b.b"}},
        {"republish": {"src": ">", "dest": "elsewhere.>"}},
        {"sources": [{"name": "OTHER"}]},
        {"allow_rollup_hdrs": True},
        {"deny_purge": False},
        {"max_bytes": -1},
        {"metadata": {"owner": "someone"}},
        {"allow_msg_schedules": True},  # a field this client library does not know
    ],
    ids=lambda field: next(iter(field)),
)
def test_every_field_counts_also_those_the_wanted_config_leaves_out(field: dict[str, Any]):
    found = drift.drift(_as_reported(_alerts(**field)), _alerts())
    assert set(found.changes) == set(field)
    assert found.in_place
    assert "--config" in found.command()
    assert found.without(streams.TUNABLE)


def test_an_empty_field_is_an_absent_one() -> None:
    assert not drift.drift(_alerts(sources=[], subject_transform=None), _alerts())


def test_an_unset_consumer_limit_is_raised_and_a_higher_one_kept() -> None:
    found = drift.drift(_alerts(max_consumers=-1), _alerts())
    assert set(found.changes) == {"max_consumers"}
    assert not drift.drift(_alerts(max_consumers=2_000_000), _alerts(), grow_only=["max_consumers"])


def test_a_mirror_or_another_storage_cannot_be_changed_in_place() -> None:
    assert not drift.drift(_alerts(mirror={"name": "X"}), _alerts()).in_place
    assert not drift.drift(_alerts(storage="memory"), _alerts()).in_place


def test_tunable_fields_are_left_out_on_request() -> None:
    found = drift.drift(_alerts(), _alerts(num_replicas=3, max_age=1))
    assert set(found.without(["num_replicas"]).changes) == {"max_age"}


@pytest.mark.parametrize("replicas", [0, 6, -1], ids=["zero", "above-five", "negative"])
def test_replicas_outside_one_to_five_are_a_config_error(replicas: int) -> None:
    with pytest.raises(ConfigError, match="nats replicas"):
        NATSSettings(replicas=replicas)


def test_replicas_default_to_one_server() -> None:
    assert NATSSettings().replicas == 1
