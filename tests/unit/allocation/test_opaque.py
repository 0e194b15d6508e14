"""Opaque DeviceConfig: strict decoding with field paths, precedence, container env."""

from __future__ import annotations

from typing import Any

import pytest

from services.allocation.claim import opaque
from services.allocation.claim.claims import OpaqueConfig
from services.allocation.claim.opaque import DeviceConfig, Interval, Strategy
from shared.errors import InvalidOpaqueConfigError

DRIVER = "sim.dra-suite.io"
API_VERSION = "sim.dra-suite.io/v1alpha1"


def _doc(sharing: Any = None, **top: Any) -> dict[str, Any]:
    document: dict[str, Any] = {"apiVersion": API_VERSION, "kind": "DeviceConfig", **top}
    if sharing is not None:
        document["sharing"] = sharing
    return document


def test_api_version_is_derived_from_the_driver():
    assert opaque.api_version("gpu.example.com") == "gpu.example.com/v1alpha1"


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        (_doc(), DeviceConfig()),
        (_doc({"strategy": "Exclusive"}), DeviceConfig()),
        (
            _doc({"strategy": "TimeSlicing"}),
            DeviceConfig(strategy=Strategy.TIME_SLICING, interval=Interval.DEFAULT),
        ),
        (
            _doc({"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}}),
            DeviceConfig(strategy=Strategy.TIME_SLICING, interval=Interval.LONG),
        ),
        (
            _doc(
                {
                    "strategy": "SpacePartitioning",
                    "spacePartitioning": {"computePercent": 50, "memoryLimit": "10Gi"},
                }
            ),
            DeviceConfig(
                strategy=Strategy.SPACE_PARTITIONING, compute_percent=50, memory_limit="10Gi"
            ),
        ),
        (
            _doc({"strategy": "SpacePartitioning"}),
            DeviceConfig(strategy=Strategy.SPACE_PARTITIONING),
        ),
    ],
    ids=["empty", "exclusive", "time-slicing-default", "time-slicing-long", "space", "space-bare"],
)
def test_valid_configs_decode(document, expected):
    assert opaque.decode(document, driver=DRIVER) == expected


@pytest.mark.parametrize(
    ("document", "field"),
    [
        ({"kind": "DeviceConfig"}, "apiVersion"),
        (_doc() | {"apiVersion": "other.io/v1alpha1"}, "apiVersion"),
        (_doc() | {"kind": "GpuConfig"}, "kind"),
        (_doc(color="red"), "color"),
        (_doc("TimeSlicing"), "sharing"),
        (_doc({"strategy": "Shared"}), "sharing.strategy"),
        (_doc({"strategy": 1}), "sharing.strategy"),
        (_doc({"strategy": "Exclusive", "extra": 1}), "sharing.extra"),
        (
            _doc({"strategy": "TimeSlicing", "timeSlicing": {"interval": "Fast"}}),
            "sharing.timeSlicing.interval",
        ),
        (
            _doc({"strategy": "TimeSlicing", "timeSlicing": {"slice": "Short"}}),
            "sharing.timeSlicing.slice",
        ),
        (_doc({"strategy": "Exclusive", "timeSlicing": {}}), "sharing.timeSlicing"),
        (_doc({"strategy": "TimeSlicing", "spacePartitioning": {}}), "sharing.spacePartitioning"),
        (
            _doc({"strategy": "SpacePartitioning", "spacePartitioning": {"computePercent": 0}}),
            "sharing.spacePartitioning.computePercent",
        ),
        (
            _doc({"strategy": "SpacePartitioning", "spacePartitioning": {"computePercent": 101}}),
            "sharing.spacePartitioning.computePercent",
        ),
        (
            _doc({"strategy": "SpacePartitioning", "spacePartitioning": {"computePercent": "50"}}),
            "sharing.spacePartitioning.computePercent",
        ),
        (
            _doc({"strategy": "SpacePartitioning", "spacePartitioning": {"computePercent": True}}),
            "sharing.spacePartitioning.computePercent",
        ),
        (
            _doc({"strategy": "SpacePartitioning", "spacePartitioning": {"memoryLimit": "10 GB"}}),
            "sharing.spacePartitioning.memoryLimit",
        ),
        (
            _doc({"strategy": "SpacePartitioning", "spacePartitioning": {"memoryLimit": 1024}}),
            "sharing.spacePartitioning.memoryLimit",
        ),
        (
            _doc({"strategy": "SpacePartitioning", "spacePartitioning": {"memoryLimit": "0"}}),
            "sharing.spacePartitioning.memoryLimit",
        ),
    ],
    ids=[
        "no-api-version",
        "foreign-api-version",
        "wrong-kind",
        "unknown-top-field",
        "sharing-not-object",
        "unknown-strategy",
        "strategy-not-string",
        "unknown-sharing-field",
        "unknown-interval",
        "unknown-time-slicing-field",
        "time-slicing-without-its-strategy",
        "space-partitioning-without-its-strategy",
        "compute-percent-zero",
        "compute-percent-above-100",
        "compute-percent-string",
        "compute-percent-bool",
        "memory-limit-not-quantity",
        "memory-limit-not-string",
        "memory-limit-zero",
    ],
)
def test_invalid_configs_name_the_offending_field(document, field):
    with pytest.raises(InvalidOpaqueConfigError) as caught:
        opaque.decode(document, driver=DRIVER, claim_uid="uid-1")
    assert caught.value.field == field
    assert field in str(caught.value)
    assert caught.value.claim_uid == "uid-1"


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (
            _doc({"strategy": "TimeSlicing", "timeSlicing": {"interval": "Fast"}}),
            "sharing.timeSlicing.interval: 'Fast' is not one of Default, Short, Medium, Long",
        ),
        ({"kind": "DeviceConfig"}, f"apiVersion: None, expected '{API_VERSION}'"),
        (_doc(color="red"), "color: unknown field"),
        (
            _doc({"strategy": "Exclusive", "timeSlicing": {}}),
            "sharing.timeSlicing: only allowed with strategy TimeSlicing",
        ),
        (
            _doc({"strategy": "SpacePartitioning", "spacePartitioning": {"computePercent": 0}}),
            "sharing.spacePartitioning.computePercent: 0 is not an integer in 1..100",
        ),
        (
            _doc({"strategy": "SpacePartitioning", "spacePartitioning": {"memoryLimit": "10E"}}),
            "memoryLimit: '10E' is not a positive quantity up to 8Ei"
            " (exponents of at most two digits)",
        ),
        ("TimeSlicing", "parameters: expected an object, got str"),
    ],
    ids=["enum", "missing", "unknown", "cross-field", "range", "int64", "not-an-object"],
)
def test_errors_read_as_the_readme_shows_them(document, message):
    with pytest.raises(InvalidOpaqueConfigError, match=r"^invalid opaque config: ") as caught:
        opaque.decode(document, driver=DRIVER)
    assert str(caught.value).endswith(message)


def test_an_attackers_long_value_is_shortened_in_the_error():
    huge = "x" * 100_000
    document = _doc({"strategy": "TimeSlicing", "timeSlicing": {"interval": huge}})
    with pytest.raises(InvalidOpaqueConfigError) as caught:
        opaque.decode(document, driver=DRIVER)
    assert caught.value.field == "sharing.timeSlicing.interval"
    assert len(str(caught.value)) < 200


@pytest.mark.parametrize(
    ("block", "field"),
    [
        ({"computePercent": None}, "computePercent"),
        ({"memoryLimit": None}, "memoryLimit"),
        ({"memoryLimit": " 1Gi"}, "memoryLimit"),
        ({"memoryLimit": "1e100"}, "memoryLimit"),
        ({"memoryLimit": "1e2147483647"}, "memoryLimit"),
    ],
    ids=["null-percent", "null-limit", "padded-limit", "three-digit-exponent", "huge-exponent"],
)
def test_what_the_admission_policy_refuses_the_agent_refuses_too(block, field):
    """Rules of the one schema that the policy's CEL needs: null is no value, a quantity is
    not trimmed, and its exponent has at most two digits."""
    document = _doc({"strategy": "SpacePartitioning", "spacePartitioning": block})
    with pytest.raises(InvalidOpaqueConfigError) as caught:
        opaque.decode(document, driver=DRIVER)
    assert caught.value.field == f"sharing.spacePartitioning.{field}"


def test_a_partition_profile_is_decoded():
    config = opaque.decode(_doc(partition={"profile": "1g.10gb"}), driver=DRIVER)
    assert config == DeviceConfig(partition_profile="1g.10gb")


def test_a_memory_limit_in_any_kubernetes_notation_is_read_in_whole_bytes():
    block = {"memoryLimit": "1.5e3"}
    config = opaque.decode(
        _doc({"strategy": "SpacePartitioning", "spacePartitioning": block}), driver=DRIVER
    )
    assert config.memory_limit_bytes == 1500


def _config(source: str, requests: tuple[str, ...], sharing: dict[str, Any]) -> OpaqueConfig:
    return OpaqueConfig(source=source, requests=requests, parameters=_doc(sharing))


def test_claim_configs_override_class_configs_for_the_requests_they_name():
    configs = [
        _config("FromClass", (), {"strategy": "TimeSlicing"}),
        _config("FromClaim", ("b/sub",), {"strategy": "Exclusive"}),
    ]
    resolved = opaque.resolve(configs, ["a", "b"], driver=DRIVER, claim_uid="u")
    assert resolved == {
        "a": DeviceConfig(strategy=Strategy.TIME_SLICING, interval=Interval.DEFAULT),
        "b": DeviceConfig(),
    }


def test_a_bad_config_fails_even_when_a_later_one_would_override_it():
    configs = [
        _config("FromClass", (), {"strategy": "Bogus"}),
        _config("FromClaim", (), {"strategy": "Exclusive"}),
    ]
    with pytest.raises(InvalidOpaqueConfigError, match=r"config #0 \(FromClass\)"):
        opaque.resolve(configs, ["a"], driver=DRIVER, claim_uid="u")


def test_requests_without_a_config_have_none():
    configs = [_config("FromClaim", ("a",), {"strategy": "Exclusive"})]
    assert opaque.resolve(configs, ["a", "b"], driver=DRIVER, claim_uid="u") == {
        "a": DeviceConfig()
    }


@pytest.mark.parametrize(
    ("config", "nvidia_devices", "env"),
    [
        (DeviceConfig(), 0, {"DRA_SUITE_SHARING_STRATEGY": "Exclusive"}),
        (
            DeviceConfig(strategy=Strategy.TIME_SLICING, interval=Interval.SHORT),
            1,
            {"DRA_SUITE_SHARING_STRATEGY": "TimeSlicing", "DRA_SUITE_TIMESLICE_INTERVAL": "Short"},
        ),
        (
            DeviceConfig(
                strategy=Strategy.SPACE_PARTITIONING, compute_percent=25, memory_limit="1Gi"
            ),
            0,
            {
                "DRA_SUITE_SHARING_STRATEGY": "SpacePartitioning",
                "DRA_SUITE_COMPUTE_PERCENT": "25",
                "DRA_SUITE_MEMORY_LIMIT": str(2**30),
            },
        ),
        (
            DeviceConfig(
                strategy=Strategy.SPACE_PARTITIONING, compute_percent=25, memory_limit="2G"
            ),
            2,
            {
                "DRA_SUITE_SHARING_STRATEGY": "SpacePartitioning",
                "DRA_SUITE_COMPUTE_PERCENT": "25",
                "DRA_SUITE_MEMORY_LIMIT": "2000000000",
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=1907M,1=1907M",
            },
        ),
    ],
    ids=["exclusive", "time-slicing", "space-npu", "space-nvidia-mps"],
)
def test_container_env_carries_the_config(config, nvidia_devices, env):
    assert opaque.container_env(config, nvidia_devices=nvidia_devices) == env


@pytest.mark.parametrize(
    "config",
    [
        DeviceConfig(),
        DeviceConfig(strategy=Strategy.TIME_SLICING, interval=Interval.MEDIUM),
        DeviceConfig(strategy=Strategy.SPACE_PARTITIONING, compute_percent=10),
        DeviceConfig(strategy=Strategy.SPACE_PARTITIONING, memory_limit="512Mi"),
    ],
    ids=["exclusive", "time-slicing", "space-compute", "space-memory"],
)
def test_encoded_configs_decode_to_themselves(config):
    assert opaque.decode(opaque.encode(config, driver=DRIVER), driver=DRIVER) == config


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        (_doc(partition={"profile": "1g.10gb"}), DeviceConfig(partition_profile="1g.10gb")),
        (
            _doc(partition={"profile": "1g.10gb+me"}),
            DeviceConfig(partition_profile="1g.10gb+me"),
        ),
        (
            _doc({"strategy": "TimeSlicing"}, partition={"profile": "vir05_1c_8g"}),
            DeviceConfig(
                strategy=Strategy.TIME_SLICING,
                interval=Interval.DEFAULT,
                partition_profile="vir05_1c_8g",
            ),
        ),
    ],
    ids=["mig-profile", "mig-profile-with-media", "vnpu-template-with-sharing"],
)
def test_a_partition_profile_decodes_alone_or_with_sharing(document, expected):
    config = opaque.decode(document, driver=DRIVER)
    assert config == expected
    assert opaque.decode(opaque.encode(config, driver=DRIVER), driver=DRIVER) == config


@pytest.mark.parametrize(
    ("partition", "field"),
    [
        ("1g.10gb", "partition"),
        ({}, "partition.profile"),
        ({"profile": 7}, "partition.profile"),
        ({"profile": ""}, "partition.profile"),
        ({"profile": "1g 10gb"}, "partition.profile"),
        ({"profile": "-1g"}, "partition.profile"),
        ({"profile": "x" * 64}, "partition.profile"),
        ({"profile": "1g.10gb", "count": 2}, "partition.count"),
    ],
    ids=[
        "not-an-object",
        "no-profile",
        "profile-not-string",
        "profile-empty",
        "profile-with-space",
        "profile-starts-with-dash",
        "profile-too-long",
        "unknown-partition-field",
    ],
)
def test_an_invalid_partition_names_the_offending_field(partition, field):
    with pytest.raises(InvalidOpaqueConfigError) as caught:
        opaque.decode(_doc(partition=partition), driver=DRIVER, claim_uid="uid-1")
    assert caught.value.field == field
    assert field in str(caught.value)
