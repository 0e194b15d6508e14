"""Device checks against the ResourceSlice limits, before anything is published."""

from __future__ import annotations

import pytest

from services.discovery import validation
from shared.pb.drasuite.v1 import inventory_pb2

DRIVER = "sim.dra-suite.io"


def _with_attribute(key: str, value: inventory_pb2.AttributeValue) -> inventory_pb2.Device:
    device = inventory_pb2.Device(name="dev-0")
    device.attributes[key].CopyFrom(value)
    return device


def test_a_sim_like_device_passes():
    device = _with_attribute("numaNode", inventory_pb2.AttributeValue(int=1))
    device.attributes["resource.kubernetes.io/pcieRoot"].string = "pci0000:00"
    device.attributes["driverVersion"].version = "580.95.5"
    device.capacity["memory"] = "80Gi"
    assert validation.check_device(device, driver=DRIVER) == []


@pytest.mark.parametrize(
    ("key", "value", "problem"),
    [
        ("model", inventory_pb2.AttributeValue(string="x" * 65), "longer than 64 bytes"),
        ("model", inventory_pb2.AttributeValue(string="é" * 33), "longer than 64 bytes"),
        ("driverVersion", inventory_pb2.AttributeValue(version="1.2"), "not semver"),
        ("empty", inventory_pb2.AttributeValue(), "has no value"),
        ("9lives", inventory_pb2.AttributeValue(int=1), "C identifier"),
        ("a" * 33, inventory_pb2.AttributeValue(int=1), "C identifier"),
        ("a/b/c", inventory_pb2.AttributeValue(int=1), "more than one '/'"),
        ("Bad_Domain!/x", inventory_pb2.AttributeValue(int=1), "domain must be a DNS subdomain"),
    ],
    ids=[
        "string-too-long",
        "string-too-many-bytes",
        "version-not-semver",
        "no-value",
        "name-not-identifier",
        "name-too-long",
        "two-slashes",
        "bad-domain",
    ],
)
def test_bad_attributes_are_reported(key, value, problem):
    (reported,) = validation.check_device(_with_attribute(key, value), driver=DRIVER)
    assert problem in reported
    assert repr(key) in reported


def test_the_same_attribute_twice_through_the_driver_domain_is_reported():
    device = _with_attribute("numaNode", inventory_pb2.AttributeValue(int=1))
    device.attributes[f"{DRIVER}/numaNode"].int = 2
    (reported,) = validation.check_device(device, driver=DRIVER)
    assert "same attribute" in reported


def test_more_than_32_attributes_and_capacities_is_reported():
    device = inventory_pb2.Device(name="dev-0")
    for i in range(20):
        device.attributes[f"a{i}"].int = i
        device.capacity[f"c{i}"] = "1"
    assert validation.check_device(device, driver=DRIVER) == [
        "40 attributes and capacities, more than 32"
    ]


@pytest.mark.parametrize(
    ("name", "ok"),
    [("npu-0", True), ("NPU-0", False), ("npu_0", False), ("a" * 64, False)],
    ids=["dns-label", "upper-case", "underscore", "too-long"],
)
def test_device_names_must_be_dns_labels(name, ok):
    assert (validation.check_device(inventory_pb2.Device(name=name), driver=DRIVER) == []) is ok


@pytest.mark.parametrize(
    ("quantity", "ok"),
    [("32Gi", True), ("20", True), ("1.5", True), ("500m", True), ("32 GB", False), ("", False)],
    ids=["binary-suffix", "plain", "decimal", "milli", "words", "empty"],
)
def test_capacity_must_be_a_quantity(quantity, ok):
    device = inventory_pb2.Device(name="dev-0", capacity={"memory": quantity})
    assert (validation.check_device(device, driver=DRIVER) == []) is ok


def test_counter_consumption_limits_are_checked():
    device = inventory_pb2.Device(name="p-0")
    for name in ("a", "b", "c"):
        device.consumes_counters.add(counter_set=name, counters={"memory": "1Gi"})
    problems = validation.check_device(device, driver=DRIVER, counter_sets={"a", "b", "c"})
    assert problems == ["consumes more than 2 counter sets"]


def test_counter_sets_need_dns_label_names_and_quantities():
    bad = inventory_pb2.CounterSet(name="Mem", counters={"memory": "lots"})
    assert validation.check_counter_set(bad) == [
        "counter set name 'Mem' is not a DNS label",
        "counter set 'Mem': counter 'memory': 'lots' is not a quantity",
    ]
