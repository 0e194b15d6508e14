"""Kubernetes quantities as resource.Quantity reads and writes them: the cases are upstream's
(k8s.io/apimachinery/pkg/api/resource/quantity_test.go) where it has them."""

from decimal import Decimal

import pytest

from shared import quantity
from shared.quantity import Format, QuantityError


@pytest.mark.parametrize(
    ("text", "value", "fmt"),
    [
        ("0", "0", Format.DECIMAL_SI),
        ("1", "1", Format.DECIMAL_SI),
        ("+1", "1", Format.DECIMAL_SI),
        ("-1", "-1", Format.DECIMAL_SI),
        ("1.5", "1.5", Format.DECIMAL_SI),
        (".5", "0.5", Format.DECIMAL_SI),
        ("1.", "1", Format.DECIMAL_SI),
        ("007", "7", Format.DECIMAL_SI),
        ("500m", "0.5", Format.DECIMAL_SI),
        ("100u", "0.0001", Format.DECIMAL_SI),
        ("3n", "0.000000003", Format.DECIMAL_SI),
        ("1k", "1000", Format.DECIMAL_SI),
        ("2M", "2000000", Format.DECIMAL_SI),
        ("3G", "3000000000", Format.DECIMAL_SI),
        ("4T", "4e12", Format.DECIMAL_SI),
        ("5P", "5e15", Format.DECIMAL_SI),
        ("6E", "6e18", Format.DECIMAL_SI),
        ("1Ki", "1024", Format.BINARY_SI),
        ("1Mi", str(2**20), Format.BINARY_SI),
        ("30Gi", "32212254720", Format.BINARY_SI),
        ("1Ti", str(2**40), Format.BINARY_SI),
        ("1Pi", str(2**50), Format.BINARY_SI),
        ("1Ei", str(2**60), Format.BINARY_SI),
        ("1.5Gi", "1610612736", Format.BINARY_SI),
        ("1e3", "1000", Format.DECIMAL_EXPONENT),
        ("1E3", "1000", Format.DECIMAL_EXPONENT),
        ("1e+3", "1000", Format.DECIMAL_EXPONENT),
        ("15e-1", "1.5", Format.DECIMAL_EXPONENT),
        ("-2e2", "-200", Format.DECIMAL_EXPONENT),
    ],
)
def test_quantities_read_as_kubernetes_reads_them(text, value, fmt):
    parsed = quantity.parse_quantity(text)
    assert parsed.value == Decimal(value)
    assert parsed.format is fmt


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0.1n", "1e-9"),  # rounded up to a whole nano: asking for some gets some
        ("3.001n", "4e-9"),
        ("1.1E-9", "2e-9"),
        ("-0.1n", "-1e-9"),  # away from zero
        ("1e-20", "1e-9"),
        ("8Ei", str(2**63 - 1)),  # binary SI is capped at int64
        ("-8Ei", str(-(2**63 - 1))),
        ("100000000000000000000", "1e20"),  # decimal SI is not
        ("1e4294967296", "1"),  # the exponent as Go's int32 keeps it
        (" 1Gi ", str(2**30)),  # UnmarshalJSON trims
        ("Gi", "0"),  # an empty number is zero, as in ParseQuantity
        ("-", "0"),
        (".", "0"),
    ],
)
def test_edge_cases_read_as_kubernetes_reads_them(text, value):
    assert quantity.parse(text) == Decimal(value)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "regular expression"),
        ("1.1.M", "regular expression"),
        ("1+1.0M", "regular expression"),
        ("0.1mi", "suffix"),
        ("0.1am", "regular expression"),
        ("aoeu", "regular expression"),
        (".5i", "suffix"),
        ("1i", "suffix"),
        ("-3.01i", "suffix"),
        ("-3.01e-", "suffix"),
        ("1e", "suffix"),
        ("1Mi5", "suffix"),
        ("1Zi", "regular expression"),
        ("1 Gi", "regular expression"),
        ("32 GB", "regular expression"),
        ("1e99999999999999999999", "suffix"),  # the exponent overflows int64
        ("1e999999999", "out of range"),
    ],
)
def test_what_is_not_a_quantity_says_why(text, reason):
    with pytest.raises(QuantityError, match=reason) as caught:
        quantity.parse(text)
    assert caught.value.text == text.strip()
    assert not quantity.is_quantity(text)


def test_a_long_invalid_text_is_shortened_in_the_error():
    with pytest.raises(QuantityError) as caught:
        quantity.parse("x" * 10_000)
    assert len(str(caught.value)) < 200


def test_a_non_string_is_not_a_quantity():
    assert not quantity.is_quantity(5)
    with pytest.raises(QuantityError, match="not a string"):
        quantity.parse(None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "written"),
    [
        ("0", "0"),
        ("0Gi", "0"),
        ("1.5", "1500m"),
        ("1.5Gi", "1536Mi"),
        ("1024Mi", "1Gi"),
        ("1023Ki", "1023Ki"),
        ("1000", "1k"),
        ("1500", "1500"),
        ("0.5Gi", "512Mi"),
        ("0.5Ki", "512"),  # binary below 1024 is written in decimal SI
        ("1.0001Ki", "1024102400u"),  # binary with a fraction too
        ("100u", "100u"),
        ("0.0005", "500u"),
        ("3.001n", "4n"),
        ("-1.5k", "-1500"),
        ("5000m", "5"),
        ("1e3", "1e3"),
        ("1.5e3", "1500"),
        ("12e6", "12e6"),
        ("1.1E-9", "2e-9"),
        ("8Ei", "9223372036854775807"),
        ("1000E", "1e21"),
    ],
)
def test_canonical_form_is_what_the_api_server_writes(text, written):
    assert quantity.canonical(text) == written


@pytest.mark.parametrize(
    ("a", "b", "order"),
    [
        ("1Gi", "1024Mi", 0),
        ("1k", "1000", 0),
        ("500m", "0.5", 0),
        ("1e3", "1k", 0),
        ("1G", "1Gi", -1),
        ("1Ki", "1k", 1),
        ("-1", "0", -1),
    ],
)
def test_quantities_compare_by_value(a, b, order):
    assert quantity.compare(a, b) == order
    assert (quantity.parse_quantity(a) == quantity.parse_quantity(b)) is (order == 0)


@pytest.mark.parametrize(
    ("amount", "text"),
    [
        (30 * 2**30, "30Gi"),
        (1536 * 2**20, "1536Mi"),
        (2000, "2k"),
        (7, "7"),
        (0, "0"),
        (Decimal("0.5"), "500m"),
        (-(2**30), "-1Gi"),
    ],
)
def test_computed_amounts_are_written_exactly_and_read_back(amount, text):
    assert quantity.exact(Decimal(amount)) == text
    assert quantity.parse(text) == amount


@pytest.mark.parametrize(
    ("value", "whole"),
    [
        (Decimal(5), 5),
        (Decimal("1.5"), None),
        (Decimal(2**63), None),
        (Decimal("1e999999"), None),  # refused before int() builds a million digits
        (Decimal(-(2**63 - 1)), -(2**63 - 1)),
    ],
)
def test_as_int_is_bounded(value, whole):
    assert quantity.as_int(value) == whole


@pytest.mark.parametrize(
    ("n_bytes", "text"),
    [(85899345920, "80Gi"), (85520809984, "81559Mi"), (1000, "1000"), (0, "0"), (1024, "1Ki")],
)
def test_byte_counts_take_the_largest_binary_suffix(n_bytes, text):
    assert quantity.binary(n_bytes) == text
    assert quantity.parse(text) == n_bytes


def test_negative_byte_counts_are_refused():
    with pytest.raises(ValueError, match="negative"):
        quantity.binary(-1)


@pytest.mark.parametrize(
    ("text", "value", "fmt"),
    [
        ("0.5e-2", "0.005", Format.DECIMAL_EXPONENT),
        ("10.035M", "10035000", Format.DECIMAL_SI),
        ("1.3E+6", "1300000", Format.DECIMAL_EXPONENT),
        ("1.7E18", "1.7e18", Format.DECIMAL_EXPONENT),
        ("1.01E", "1.01e18", Format.DECIMAL_SI),
        ("0.0000000005", "1e-9", Format.DECIMAL_SI),
        ("0.5e-9", "1e-9", Format.DECIMAL_EXPONENT),
        ("0.00000012345", "124e-9", Format.DECIMAL_SI),
        ("9Ei", str(2**63 - 1), Format.BINARY_SI),
        ("9223372036854775807Ki", str(2**63 - 1), Format.BINARY_SI),
        ("100.035Ki", "102435.84", Format.BINARY_SI),
        ("0.025Ti", "27487790694.4", Format.BINARY_SI),
        ("0.000000000001Ki", "2e-9", Format.DECIMAL_SI),  # rounds up, changes format
        (".0001k", "0.1", Format.DECIMAL_SI),
        ("1.G", "1e9", Format.DECIMAL_SI),
    ],
)
def test_upstreams_parse_table(text, value, fmt):
    for sign in ("", "+"):
        parsed = quantity.parse_quantity(sign + text)
        assert (parsed.value, parsed.format) == (Decimal(value), fmt)
    assert quantity.parse("-" + text) == -Decimal(value)


@pytest.mark.parametrize(
    ("text", "written"),
    [
        ("1Ki", "1Ki"),
        ("1024Mi", "1Gi"),
        ("1000M", "1G"),
        (".001Ki", "1024m"),
        (".000001Ki", "1024u"),
        (".000000001Ki", "1024n"),
        (".000000000001Ki", "2n"),
        ("1080m", "1080m"),
        ("1.08", "1080m"),
        ("1080000000n", "1080m"),
        ("307200Ki", "300Mi"),
        ("1025024Mi", "1001Gi"),
        (".001e12", "1e9"),
        ("0.001e0", "1e-3"),
        ("1000e-12", "1e-9"),
        ("0.001T", "1G"),
        ("1000u", "1m"),
    ],
)
def test_upstreams_canonical_strings(text, written):
    assert quantity.canonical(text) == written
    if written != "0":
        assert quantity.canonical("-" + text) == "-" + written
