"""AllocationConfig: kubelet defaults, derived paths, validation, flags and env twins."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.allocation import cli
from services.allocation.config import AllocationConfig
from shared.errors import ConfigError


def test_defaults_are_the_kubelets():
    config = AllocationConfig(node_name="node-a")
    assert config.dra_socket_path == Path("/var/lib/kubelet/plugins/sim.dra-suite.io/dra.sock")
    assert config.registration_socket_path == Path(
        "/var/lib/kubelet/plugins_registry/sim.dra-suite.io-reg.sock"
    )
    assert config.checkpoint_dir == Path("/var/lib/kubelet/plugins/sim.dra-suite.io/checkpoint")
    assert config.cdi_root == Path("/var/run/cdi")
    assert config.pool_name == "node-a"
    assert (config.health_resend_interval_s, config.health_check_timeout_s) == (10.0, 30)


def test_plugin_data_dir_is_derived_from_the_driver_when_empty():
    config = AllocationConfig(
        node_name="n", driver_name="gpu.example.com", plugin_data_dir=Path("")
    )
    assert config.data_dir == Path("/var/lib/kubelet/plugins/gpu.example.com")


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"node_name": ""}, "node_name"),
        ({"node_name": "Node_A"}, "node_name"),
        ({"driver_name": "-bad.example.com"}, "driver_name"),
        ({"health_resend_interval_s": 0}, "health_resend_interval_s"),
        ({"health_check_timeout_s": 10}, "health_check_timeout_s"),
        ({"plugin_data_dir": Path("/" + "x" * 120)}, "plugin_data_dir"),
        ({"plugin_registry_dir": Path("relative")}, "plugin_data_dir"),
    ],
    ids=[
        "empty-node",
        "node-not-dns",
        "driver-not-dns",
        "zero-resend",
        "timeout-not-above-resend",
        "socket-path-too-long",
        "relative-socket-path",
    ],
)
def test_invalid_settings_raise_config_error(changes, field):
    with pytest.raises(ConfigError) as caught:
        AllocationConfig(**{"node_name": "node-a", **changes})
    assert caught.value.field == field


def test_flags_win_over_env_twins():
    config = cli.build_config(
        ["--node-name", "from-flag", "--cdi-root", "/flag/cdi"],
        {"NODE_NAME": "from-env", "CDI_ROOT": "/env/cdi", "PLUGIN_DATA_DIR": "/env/data"},
    )
    assert config.node_name == "from-flag"
    assert config.cdi_root == Path("/flag/cdi")
    assert config.dra_socket_path == Path("/env/data/dra.sock")


def test_node_name_defaults_to_the_hostname():
    assert cli.build_config([], {}).node_name


def test_rolling_updates_put_the_instance_uid_in_both_socket_names():
    config = AllocationConfig(node_name="node-a", rolling_update_uid="8f3e-41")
    assert config.dra_socket_path == Path(
        "/var/lib/kubelet/plugins/sim.dra-suite.io/dra-8f3e-41.sock"
    )
    assert config.registration_socket_path == Path(
        "/var/lib/kubelet/plugins_registry/sim.dra-suite.io-8f3e-41-reg.sock"
    )
    assert config.serialize_lock_path == Path(
        "/var/lib/kubelet/plugins/sim.dra-suite.io/serialize.lock"
    )


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"rolling_update_uid": "../x"}, "rolling_update_uid"),
        ({"rolling_update_uid": "a" * 64}, "rolling_update_uid"),
        ({"replaced_claim_wait_s": -1}, "replaced_claim_wait_s"),
        ({"inventory_wait_s": -1}, "inventory_wait_s"),
        ({"crash_at": "somewhere"}, "crash_at"),
    ],
    ids=[
        "uid-with-slash",
        "uid-too-long",
        "negative-wait",
        "negative-inventory-wait",
        "unknown-crash-step",
    ],
)
def test_invalid_instance_settings_raise_config_error(changes, field):
    with pytest.raises(ConfigError) as caught:
        AllocationConfig(**{"node_name": "node-a", **changes})
    assert caught.value.field == field


def test_rolling_update_uid_comes_from_its_env_twin():
    config = cli.build_config(["--node-name", "n"], {"ROLLING_UPDATE_UID": "pod-1"})
    assert config.rolling_update_uid == "pod-1"
    assert config.dra_socket_path.name == "dra-pod-1.sock"


def test_the_crash_seam_is_read_from_the_env_only_by_the_cli():
    assert cli.build_config(["--node-name", "n"], {}).crash_at == ""
    config = cli.build_config(["--node-name", "n"], {cli.CRASH_AT_ENV: "cdi-written"})
    assert config.crash_at == "cdi-written"
    with pytest.raises(ConfigError):
        cli.build_config(["--node-name", "n"], {cli.CRASH_AT_ENV: "nowhere"})
