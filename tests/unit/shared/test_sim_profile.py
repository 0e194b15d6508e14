"""Sim profiles: the optional per-device `mig` and `shared` keys, and the shipped profiles."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from shared.errors import ConfigError
from shared.sim import profile


def _document(**extra: Any) -> dict[str, Any]:
    device = {"name": "gpu-0", "kind": "gpu", "capacity": {"memory": "80Gi"}, **extra}
    return {"kind": "SimProfile", "metadata": {"name": "t"}, "devices": [device]}


@pytest.mark.parametrize(
    ("extra", "mig_profiles", "shared"),
    [
        ({}, (), {}),
        ({"mig": {"profiles": ["1g.10gb", "3g.40gb"]}}, ("1g.10gb", "3g.40gb"), {}),
        ({"mig": {"profiles": ["7g.80gb", "7g.80gb"]}}, ("7g.80gb",), {}),
        ({"mig": {"profiles": list(profile.H100_MIG_PROFILES)}}, profile.H100_MIG_PROFILES, {}),
        ({"shared": {"memory": True}}, (), {"memory": "1Gi"}),
        ({"shared": {"memory": "512Mi"}}, (), {"memory": "512Mi"}),
    ],
    ids=["plain", "two-profiles", "duplicates-once", "every-h100-profile", "shared", "step"],
)
def test_valid_mig_and_shared_keys_are_parsed(extra, mig_profiles, shared):
    (device,) = profile.parse(_document(**extra), source="t.yaml").devices
    assert device.mig_profiles == mig_profiles
    assert device.shared == shared


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"mig": {"profiles": ["1g.18gb"]}}, "'1g.18gb' is not one of"),
        ({"mig": {"profiles": []}}, "must be a non-empty list"),
        ({"mig": {"profiles": ["1g.10gb"], "mode": "on"}}, "only the key profiles"),
        ({"mig": {"profile": ["1g.10gb"]}}, "only the key profiles"),
        ({"mig": ["1g.10gb"]}, "only the key profiles"),
        ({"shared": {"cores": True}}, "names no capacity of the device"),
        ({"shared": {"memory": False}}, "is not true or a step quantity"),
        ({"shared": {"memory": "0Gi"}}, "is not true or a step quantity"),
        ({"shared": {"memory": "lots"}}, "is not true or a step quantity"),
        ({"shared": {}}, "non-empty mapping"),
        (
            {"mig": {"profiles": ["1g.10gb"]}, "shared": {"memory": True}},
            "MIG and sharing don't mix",
        ),
    ],
    ids=[
        "h200-profile-name",
        "no-profiles",
        "unknown-mig-key",
        "misspelt-mig-key",
        "mig-not-a-mapping",
        "unknown-capacity",
        "false",
        "zero-step",
        "not-a-quantity",
        "empty-shared",
        "mig-and-shared",
    ],
)
def test_invalid_mig_and_shared_keys_are_config_errors(extra, message):
    with pytest.raises(ConfigError, match=message):
        profile.parse(_document(**extra), source="t.yaml")


def test_the_new_profiles_ship_beside_the_old_ones():
    assert {"mixed", "ascend-910b", "gpu", "gpu-mig", "gpu-shared"} <= set(profile.shipped())


def test_gpu_mig_has_four_h100s_with_mig_profiles_and_no_sharing():
    loaded = profile.load("gpu-mig")
    assert [d.name for d in loaded.devices] == [f"gpu-{i}" for i in range(4)]
    assert all(d.mig_profiles and not d.shared for d in loaded.devices)


def test_gpu_shared_has_one_shared_gpu_and_one_exclusive_gpu():
    loaded = profile.load("gpu-shared")
    assert [(d.name, d.shared, d.mig_profiles) for d in loaded.devices] == [
        ("gpu-0", {"memory": "1Gi"}, ()),
        ("gpu-1", {}, ()),
    ]


@pytest.mark.parametrize("name", ["mixed", "ascend-910b", "gpu"])
def test_the_older_profiles_use_neither_mig_nor_sharing(name):
    assert all(not d.mig_profiles and not d.shared for d in profile.load(name).devices)


def test_a_profile_file_is_parsed_once_per_content(tmp_path: Path) -> None:
    path = tmp_path / "lab.yaml"
    lab = "kind: SimProfile\nmetadata: {name: lab}\ndevices:\n  - {name: %s, kind: gpu}\n"
    path.write_text(lab % "gpu-0")
    first = profile.load(str(path))
    assert profile.load(str(path)) is first  # the agents of one process share the parse
    path.write_text(lab % "gpu-1")
    changed = profile.load(str(path))
    assert [d.name for d in changed.devices] == ["gpu-1"]
