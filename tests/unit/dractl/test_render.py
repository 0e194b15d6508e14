"""dractl's pure formatting: AGE like kubectl's, RFC 3339 times, lines cut to a terminal."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from services.dractl import document, render
from services.dractl.commands import health
from shared.pb.drasuite.v1 import health_pb2

NOW = datetime(2026, 11, 24, 12, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("then", "shown"),
    [
        ("2026-11-24T11:59:15.000Z", "45s"),
        ("2026-11-24T11:58:01.000Z", "119s"),
        ("2026-11-24T11:50:00.000Z", "10m"),
        ("2026-11-24T07:00:00.000Z", "5h"),
        ("2026-11-21T12:00:00.000Z", "3d"),
        ("2026-11-24T12:00:05.000Z", "0s"),
        (None, "<unknown>"),
    ],
    ids=["seconds", "under-two-minutes", "minutes", "hours", "days", "clock-skew", "unset"],
)
def test_age_reads_like_kubectl(then: str | None, shown: str) -> None:
    assert render.age(then, now=NOW) == shown


def test_times_are_rfc3339_in_utc_with_milliseconds_and_unset_is_none() -> None:
    assert document.rfc3339(1_763_780_000_123) == "2025-11-22T02:53:20.123Z"
    assert document.rfc3339(0) is None


def test_an_unknown_enum_number_stays_a_number() -> None:
    # A newer agent's state: proto3 keeps an unknown enum number as it is.
    record = health_pb2.DeviceHealth(device="gpu-0", state=health_pb2.HealthState.ValueType(7))
    assert health.item(record)["state"] == "7"


def test_a_line_longer_than_the_terminal_is_cut_with_an_ellipsis() -> None:
    line = render.row_line(["gpu-0", "x" * 100], [5, 100], width=40)
    assert len(line) == 40
    assert line.endswith("…")
    assert render.row_line(["gpu-0", "short"], [5, 5], width=40) == "gpu-0   short"
