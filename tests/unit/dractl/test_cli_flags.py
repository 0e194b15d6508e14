"""dractl's global flags: before or after the command, never reset by the command's parser."""

from __future__ import annotations

import pytest

from services.dractl import cli


@pytest.mark.parametrize(
    "argv",
    [
        ["--nats-url", "nats://a:1", "-o", "yaml", "--nats-replicas", "3", "claims"],
        ["claims", "--nats-url", "nats://a:1", "-o", "yaml", "--nats-replicas", "3"],
        ["-o", "yaml", "claims", "--nats-url", "nats://a:1", "--nats-replicas", "3"],
    ],
    ids=["before", "after", "mixed"],
)
def test_global_flags_mean_the_same_anywhere(argv: list[str]) -> None:
    args = cli._parser().parse_args(argv)
    assert (args.nats_url, args.output, args.nats_replicas) == ("nats://a:1", "yaml", 3)


def test_flags_not_given_keep_their_defaults_below_the_command() -> None:
    args = cli._parser().parse_args(["--driver-name", "gpu.example.com", "health"])
    assert args.driver_name == "gpu.example.com"
    assert args.output == "table"
    assert args.nats_url is None  # from_args then takes NATS_URL, else the default
