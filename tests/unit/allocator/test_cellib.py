"""The Kubernetes CEL libraries as selectors use them: semver ordering (pre-releases before the
release, numeric identifiers before alphanumeric) and quantities compared by value."""

from __future__ import annotations

import pytest

from services.allocator.cellib import Quantity, Semver
from services.allocator.device import Device
from services.allocator.selector import check, evaluate
from shared import quantity


@pytest.mark.parametrize(
    ("lower", "higher"),
    [
        ("1.2.3", "1.2.4"),
        ("1.9.0", "1.10.0"),
        ("1.0.0-alpha", "1.0.0"),
        ("1.0.0-alpha.1", "1.0.0-alpha.beta"),
        ("1.0.0-2", "1.0.0-10"),
        ("550.54.15", "580.95.5"),
    ],
)
def test_semver_orders_as_semver_2(lower, higher):
    assert Semver(lower) < Semver(higher)


@pytest.mark.parametrize("text", ["1.2", "01.2.3", "1.2.3.4", "v1.2.3", ""])
def test_invalid_semver_is_refused(text):
    with pytest.raises(ValueError, match="invalid semver"):
        Semver(text)


@pytest.mark.parametrize(
    ("a", "b"), [("1Gi", "1024Mi"), ("1k", "1000"), ("500m", "0.5"), ("1e3", "1k")]
)
def test_quantities_compare_by_value(a, b):
    assert Quantity(a) == Quantity(b)
    assert quantity.parse(a) == quantity.parse(b)


@pytest.mark.parametrize("text", ["1 Gi", "1.2.3", "1Zi", "1e", ""])
def test_what_is_not_a_quantity_is_refused(text):
    with pytest.raises(ValueError, match="not a quantity"):
        quantity.parse(text)


DEVICE = Device.from_json(
    {"name": "d", "attributes": {"v": {"version": "1.2.3"}}, "capacity": {"m": {"value": "1Gi"}}},
    driver="x.example.com",
    pool="p",
)


@pytest.mark.parametrize(
    ("expression", "matches"),
    [
        ('isSemver("1.2.3") && !isSemver("1.2")', True),
        ('isQuantity("1Gi") && !isQuantity("one")', True),
        ('device.attributes["x.example.com"].v.minor() == 2', True),
        ('device.capacity["x.example.com"].m.add(quantity("1Gi")) == quantity("2Gi")', True),
        ('device.capacity["x.example.com"].m.sub(1073741824).sign() == 0', True),
        ('device.capacity["x.example.com"].m.asInteger() == 1073741824', True),
        ('quantity("1.5").isInteger()', False),
    ],
)
def test_library_functions(expression, matches):
    assert check(expression) == ""
    outcome = evaluate(expression, DEVICE)
    assert outcome.error == ""
    assert outcome.matches is matches


def test_a_bad_literal_is_a_runtime_error():
    outcome = evaluate('semver("not-a-version") == semver("1.0.0")', DEVICE)
    assert "invalid semver" in outcome.error
