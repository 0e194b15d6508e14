"""Discovery flags, env twins, defaults and validation; backend selection."""

from __future__ import annotations

import importlib.util
import socket
from pathlib import Path

import pytest

from services.discovery import backends, cli
from services.discovery.config import DiscoveryConfig
from shared.errors import BackendLoadError, ConfigError
from shared.vendors.ascend import discovery as ascend
from shared.vendors.nvidia import discovery as nvml
from shared.vendors.parts.discovery import BackendSeams
from shared.vendors.sim import discovery as sim
from tests.fakes.npusmi import FakeNpuSmi
from tests.fakes.nvml import FakeNVML


def test_defaults_follow_the_brief():
    config = cli.parse_config([], {"NODE_NAME": "n1"})
    assert config.driver_name == "sim.dra-suite.io"
    assert config.backend == "sim"
    assert config.sim_profile == "mixed"
    assert config.rescan_interval_s == 30.0
    assert config.pool == "n1"


def test_node_name_defaults_to_the_host_name():
    assert cli.parse_config([], {}).node_name == socket.gethostname().lower()


@pytest.mark.parametrize(
    ("argv", "env", "field", "expected"),
    [
        (["--node-name", "flag"], {"NODE_NAME": "env"}, "node_name", "flag"),
        ([], {"NODE_NAME": "env"}, "node_name", "env"),
        (["--pool-name", "p1"], {"NODE_NAME": "n"}, "pool", "p1"),
        (["--rescan-interval-s", "5"], {"NODE_NAME": "n"}, "rescan_interval_s", 5.0),
        ([], {"NODE_NAME": "n", "SIM_PROFILE": "gpu"}, "sim_profile", "gpu"),
        ([], {"NODE_NAME": "n", "BACKEND": "nvml"}, "backend", "nvml"),
        (
            ["--mig-profiles", "1g.10gb, 3g.40gb"],
            {"NODE_NAME": "n"},
            "mig_profiles",
            ("1g.10gb", "3g.40gb"),
        ),
        ([], {"NODE_NAME": "n", "MIG_PROFILES": "7g.80gb"}, "mig_profiles", ("7g.80gb",)),
        ([], {"NODE_NAME": "n"}, "mig_profiles", ()),
        (["--publish-pci-bus-id", "true"], {"NODE_NAME": "n"}, "publish_pci_bus_id", True),
        ([], {"NODE_NAME": "n"}, "publish_pci_bus_id", False),
        (["--publish-device-taints", "true"], {"NODE_NAME": "n"}, "publish_device_taints", True),
        ([], {"NODE_NAME": "n", "PUBLISH_DEVICE_TAINTS": "true"}, "publish_device_taints", True),
        ([], {"NODE_NAME": "n"}, "publish_device_taints", False),
        (
            [],
            {"NODE_NAME": "n", "NPU_SMI_PATH": "/usr/local/bin/npu-smi"},
            "npu_smi_path",
            "/usr/local/bin/npu-smi",
        ),
        ([], {"NODE_NAME": "n"}, "npu_smi_path", "npu-smi"),
        (["--sysfs-root", "/host/sys"], {"NODE_NAME": "n"}, "sysfs_root", "/host/sys"),
        ([], {"NODE_NAME": "n"}, "sysfs_root", "/sys"),
        (["--backend-timeout-s", "3"], {"NODE_NAME": "n"}, "backend_timeout_s", 3.0),
        ([], {"NODE_NAME": "n", "BACKEND_POLL_S": "2.5"}, "backend_poll_s", 2.5),
    ],
    ids=[
        "flag-beats-env",
        "env",
        "pool-name",
        "rescan",
        "sim-profile-env",
        "backend-env",
        "mig-profiles-flag",
        "mig-profiles-env",
        "mig-profiles-default-none",
        "pci-bus-id-flag",
        "pci-bus-id-default-off",
        "device-taints-flag",
        "device-taints-env",
        "device-taints-default-off",
        "npu-smi-path-env",
        "npu-smi-path-default",
        "sysfs-root-flag",
        "sysfs-root-default",
        "backend-timeout-flag",
        "backend-poll-env",
    ],
)
def test_flags_then_env_then_defaults(argv, env, field, expected):
    assert getattr(cli.parse_config(argv, env), field) == expected


def test_shared_groups_are_parsed_too():
    config = cli.parse_config(
        ["--nats-url", "nats://x:1", "--kubeconfig", "/k"], {"NODE_NAME": "n", "LOG_LEVEL": "debug"}
    )
    assert (config.nats.url, config.kube.kubeconfig, config.log.level) == (
        "nats://x:1",
        "/k",
        "debug",
    )


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"backend": "cuda"}, "backend"),
        ({"driver_name": "Not_A_Domain"}, "driver_name"),
        ({"driver_name": "d" * 64}, "driver_name"),
        ({"rescan_interval_s": 0.0}, "rescan_interval_s"),
        ({"pool_name": "bad pool"}, "pool_name"),
        ({"node_name": ""}, "node_name"),
        ({"mig_profiles": ("1g.10gb", "MIG 1g.10gb")}, "mig_profiles"),
        ({"backend_timeout_s": 0.0}, "backend_timeout_s"),
        ({"backend_poll_s": -1.0}, "backend_poll_s"),
    ],
    ids=[
        "unknown-backend",
        "bad-driver",
        "long-driver",
        "zero-rescan",
        "bad-pool",
        "no-node",
        "bad-mig-profile",
        "zero-backend-timeout",
        "negative-backend-poll",
    ],
)
def test_invalid_settings_raise_config_error(fields, field):
    with pytest.raises(ConfigError) as raised:
        DiscoveryConfig(**{"node_name": "n1", **fields})
    assert raised.value.field == field


def test_sim_backend_loads_the_configured_profile():
    backend = backends.load_backend(DiscoveryConfig(node_name="n1", sim_profile="gpu"))
    assert isinstance(backend, sim.SimBackend)
    assert backend.name == "sim"


def test_the_nvml_backend_loads_over_an_injected_library(tmp_path):
    fake = FakeNVML.node(count=2)
    config = DiscoveryConfig(
        node_name="n1",
        backend="nvml",
        mig_profiles=("1g.10gb",),
        publish_pci_bus_id=True,
        sysfs_root=str(tmp_path),
        backend_timeout_s=3.0,
        backend_poll_s=4.0,
    )
    backend = backends.load_backend(config, seams=BackendSeams(nvml=fake))
    assert isinstance(backend, nvml.NvmlBackend)
    assert fake.initialised
    assert backend.options == nvml.NvmlOptions(
        mig_profiles=("1g.10gb",), pci_bus_id=True, timeout_s=3.0, poll_s=4.0
    )
    assert backend.sysfs.root == tmp_path


@pytest.mark.skipif(importlib.util.find_spec("pynvml") is not None, reason="pynvml installed")
def test_the_nvml_backend_without_nvml_fails_to_load_with_a_clear_message():
    with pytest.raises(BackendLoadError, match="NVML is not available") as raised:
        backends.load_backend(DiscoveryConfig(node_name="n1", backend="nvml"))
    assert raised.value.backend == "nvml"


@pytest.mark.skipif(Path("/proc/driver/nvidia").exists(), reason="an NVIDIA driver is loaded")
def test_the_real_nvml_backend_without_a_driver_fails_to_load_with_a_clear_message():
    """The real pynvml, on a node with no NVIDIA driver (as CI is): no fake seam involved."""
    with pytest.raises(BackendLoadError, match=r"NVML is not available: nvmlInit: ") as raised:
        backends.load_backend(DiscoveryConfig(node_name="n1", backend="nvml"))
    assert raised.value.backend == "nvml"


def test_the_ascend_backend_loads_with_the_configured_binary():
    config = DiscoveryConfig(
        node_name="n1", backend="ascend", npu_smi_path="/opt/npu-smi", sysfs_root="/host/sys"
    )
    fake = FakeNpuSmi()
    backend = backends.load_backend(config, seams=BackendSeams(run_command=fake))
    assert isinstance(backend, ascend.AscendBackend)
    assert (backend.npu_smi, backend.run_command, str(backend.sysfs.root)) == (
        "/opt/npu-smi",
        fake,
        "/host/sys",
    )


def test_missing_sim_profile_is_a_config_error():
    with pytest.raises(ConfigError, match="sim profile"):
        backends.load_backend(DiscoveryConfig(node_name="n1", sim_profile="/no/such.yaml"))


def test_main_exits_2_on_a_bad_flag_value(capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["--node-name", "n1", "--backend", "cuda"])
    assert exited.value.code == 2
    assert "backend 'cuda'" in capsys.readouterr().err
