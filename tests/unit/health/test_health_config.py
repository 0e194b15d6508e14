"""HealthConfig from flags and env, its validation, and monitor loading."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.health import cli, monitors
from services.health.config import HealthConfig
from shared.bus.connection import Bus
from shared.config import NATSSettings
from shared.errors import BackendLoadError, ConfigError
from shared.vendors.parts.health import AscendOptions


def test_defaults_fill_the_node_name_from_the_host():
    config = cli.parse([], {})
    assert config.node_name
    assert config.monitor == "sim"
    assert config.sim_profile == "mixed"
    assert config.poll_interval_s == 1.0
    assert config.recovery_hold_s == 5.0
    assert config.flap_window_s == 5.0
    assert config.monitor_deadline_s == 30.0
    assert config.policy_file == ""
    assert config.ascend_unknown_codes == "isolate"
    assert config.taint_effect == "NoSchedule"
    assert config.event_namespace == "default"
    assert config.taint_target == "rule"
    assert config.additional_xids_to_ignore == ()


def test_the_taint_target_and_extra_ignored_xids_have_env_twins():
    config = cli.parse(
        ["--node-name", "n"],
        {"TAINT_TARGET": "slice", "ADDITIONAL_XIDS_TO_IGNORE": "48, 94"},
    )
    assert (config.taint_target, config.additional_xids_to_ignore) == ("slice", ("48", "94"))
    flagged = cli.parse(["--node-name", "n", "--taint-target", "rule"], {"TAINT_TARGET": "slice"})
    assert flagged.taint_target == "rule"


def test_nvml_monitor_flags_have_env_twins():
    config = cli.parse(
        ["--node-name", "n", "--monitor", "nvml", "--nvml-counters-s", "60"],
        {"NVML_EVENT_TIMEOUT_MS": "2000"},
    )
    assert (config.monitor, config.nvml_event_timeout_ms, config.nvml_counters_s) == (
        "nvml",
        2000,
        60.0,
    )


def test_flags_win_over_env_twins():
    config = cli.parse(
        ["--node-name", "from-flag", "--recovery-hold-s", "5"],
        {"NODE_NAME": "from-env", "TAINT_EFFECT": "NoExecute", "NATS_URL": "nats://n:4222"},
    )
    assert config.node_name == "from-flag"
    assert config.recovery_hold_s == 5.0
    assert config.taint_effect == "NoExecute"
    assert config.nats.url == "nats://n:4222"


@pytest.mark.parametrize(
    "fields",
    [
        {"monitor": "dcgm"},
        {"taint_effect": "PreferNoSchedule"},
        {"driver_name": "Not_A.Driver"},
        {"node_name": "Upper.Case"},
        {"poll_interval_s": 0.0},
        {"recovery_hold_s": -1.0},
        {"event_namespace": "kube.system"},
        {"alert_queue_size": 0},
        {"flap_window_s": -1.0},
        {"monitor_deadline_s": 0.0},
        {"ascend_unknown_codes": "panic"},
        {"nvml_event_timeout_ms": 0},
        {"nvml_counters_s": 0.0},
        {"taint_target": "node"},
        {"additional_xids_to_ignore": ("48", "xid-79")},
        {"additional_xids_to_ignore": ("-1",)},
    ],
    ids=[
        "unknown monitor",
        "unknown effect",
        "bad driver",
        "bad node",
        "zero poll",
        "negative hold",
        "bad namespace",
        "empty queue",
        "negative flap window",
        "zero monitor deadline",
        "unknown ascend code handling",
        "zero nvml event timeout",
        "zero nvml counter period",
        "unknown taint target",
        "an ignored xid that is no number",
        "a negative ignored xid",
    ],
)
def test_invalid_settings_raise_config_error(fields):
    with pytest.raises(ConfigError):
        HealthConfig(**fields)


def test_the_nvml_monitor_without_a_driver_says_nvml_is_not_available():
    if Path("/dev/nvidiactl").exists():
        pytest.skip("this machine has an NVIDIA driver")
    bus = Bus(NATSSettings(), name="unused")
    with pytest.raises(BackendLoadError, match="NVML is not available"):
        monitors.load("nvml", bus=bus, driver="sim.dra-suite.io", node="n")


def test_the_ascend_monitor_loads_with_its_options():
    bus = Bus(NATSSettings(), name="unused")
    options = AscendOptions(npu_smi="/opt/npu-smi", poll_s=3.0)
    monitor = monitors.load("ascend", bus=bus, driver="d.io", node="n", ascend_options=options)
    assert type(monitor).__name__ == "AscendMonitor"
