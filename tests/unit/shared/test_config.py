"""Settings from flags, env twins and defaults."""

from __future__ import annotations

import argparse

import pytest

from shared.config import KubeSettings, NATSSettings, add_arguments, env_name, from_args
from shared.errors import ConfigError


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser, NATSSettings)
    add_arguments(parser, KubeSettings)
    return parser.parse_args(argv)


@pytest.mark.parametrize(
    ("flag", "env"),
    [("--nats-url", "NATS_URL"), ("--cdi-root", "CDI_ROOT"), ("--kubeconfig", "KUBECONFIG")],
    ids=["nats-url", "cdi-root", "kubeconfig"],
)
def test_env_twin_is_derived_from_the_flag(flag, env):
    assert env_name(flag) == env


def test_flag_beats_env_which_beats_default():
    args = _parse(["--nats-url", "nats://flag:1"])
    env = {"NATS_URL": "nats://env:2", "NATS_NAMESPACE": "ns"}
    settings = from_args(NATSSettings, args, env)
    assert settings.url == "nats://flag:1"
    assert settings.namespace == "ns"
    assert settings.token == ""


def test_same_field_name_in_two_groups_keeps_each_flag_separate():
    args = _parse(["--kube-request-timeout-s", "7"])
    assert from_args(KubeSettings, args, {}).request_timeout_s == 7.0
    assert from_args(NATSSettings, args, {}).request_timeout_s == 2.0


def test_bad_env_value_is_a_config_error_naming_the_variable():
    with pytest.raises(ConfigError, match="NATS_CONNECT_TIMEOUT_S"):
        from_args(NATSSettings, _parse([]), {"NATS_CONNECT_TIMEOUT_S": "soon"})


def test_watch_heartbeat_comes_from_its_flag_or_env_and_must_be_positive():
    assert from_args(NATSSettings, _parse([]), {}).watch_heartbeat_s == 20.0
    args = _parse(["--nats-watch-heartbeat-s", "0.5"])
    assert from_args(NATSSettings, args, {}).watch_heartbeat_s == 0.5
    env = {"NATS_WATCH_HEARTBEAT_S": "2"}
    assert from_args(NATSSettings, _parse([]), env).watch_heartbeat_s == 2.0
    for bad in ("0", "-1", "nan"):
        with pytest.raises(ConfigError, match="heartbeat"):
            from_args(NATSSettings, _parse([]), {"NATS_WATCH_HEARTBEAT_S": bad})
