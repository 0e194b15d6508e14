"""The kubelet front switch of the allocation agent: `--kubelet-api` and the device-plugin
settings, their env twins and validation."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.allocation import cli
from services.allocation.config import AllocationConfig
from shared.errors import ConfigError


def test_the_dra_front_is_the_default_and_the_device_plugin_dir_the_kubelets():
    config = AllocationConfig(node_name="node-a")
    assert config.kubelet_api == "dra"
    assert config.device_plugin_dir == Path("/var/lib/kubelet/device-plugins")
    assert config.device_plugin_overrides == {}


@pytest.mark.parametrize(
    ("argv", "env"),
    [
        (["--kubelet-api", "device-plugin"], {}),
        ([], {"KUBELET_API": "device-plugin"}),
        (["--kubelet-api", "device-plugin"], {"KUBELET_API": "dra"}),
    ],
    ids=["flag", "env twin", "flag over env"],
)
def test_the_device_plugin_front_is_chosen_by_flag_or_env(argv, env):
    config = cli.build_config(["--node-name", "n", *argv], env)
    assert config.kubelet_api == "device-plugin"


def test_resource_names_come_from_their_flag():
    config = cli.build_config(
        ["--node-name", "n", "--device-plugin-resources", "npu=huawei.com/Ascend910"],
        {"DEVICE_PLUGIN_DIR": "/tmp/dp"},
    )
    assert config.device_plugin_overrides == {"npu": "huawei.com/Ascend910"}
    assert config.device_plugin_dir == Path("/tmp/dp")


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"kubelet_api": "both"}, "kubelet_api"),
        ({"kubelet_api": ""}, "kubelet_api"),
        ({"device_plugin_resources": "npu"}, "device_plugin_resources"),
        ({"device_plugin_resources": "npu=Ascend910"}, "device_plugin_resources"),
    ],
    ids=["unknown front", "empty front", "no name", "unqualified name"],
)
def test_bad_front_settings_are_config_errors(changes, field):
    with pytest.raises(ConfigError) as caught:
        AllocationConfig(node_name="n", **changes)
    assert caught.value.field == field
