"""A generated corpus of opaque `parameters` for the DeviceConfig schema
(services/allocation/claim/config_schema.py): hypothesis strategies walked from the schema, so
every field, type, bound and quantity form is drawn, valid and not (wrong types, `null`,
values one past each bound, unknown fields, missing required fields, blocks with the wrong
strategy, foreign apiVersions and kinds, whitespace around quantities, exponents that wrap
as Go's int32 does); plus the quantity forms worth naming, for the real API server too.

Numbers stay within what JSON carries to both readers alike: int64 integers (kube-apiserver
decodes larger ones as floats) and finite floats."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from services.allocation.claim.config_schema import (
    DEVICE_CONFIG,
    Const,
    FieldType,
    Integer,
    Object,
    OneOf,
    Pattern,
    Quantity,
)

__all__ = [
    "QUANTITY_FORMS",
    "any_json",
    "edge_cases",
    "object_paths",
    "parameters",
    "quantity_texts",
]

_INT64 = (-(2**63), 2**63 - 1)
_LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(*_INT64)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
any_json = st.recursive(
    _LEAVES,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=6,
)

QUANTITY_FORMS = (
    # accepted: every suffix, exponents, fractions, signs, the bounds
    *("1", "1Gi", "10Gi", "1.5Gi", "1536Mi", "1k", "1M", "1G", "1T", "1P", "1E", "1Ki", "1Mi"),
    *("1Ti", "1Pi", "1Ei", "7Ei", "8Ei", "9Ei", "1e3", "1E3", "1e+3", "1.5e3", "1000m", "1e18"),
    *("0.001k", "1e0", "1e-0", "+1Gi", "1.", "1.G", "01", "9223372036854775807", "1000e-3"),
    *("9223372036854775807.999", "9.223372036854775807e18", "9223372036854775807999m"),
    *("0.9999999999", "0.9999999991", "1000000000n", "1000000u", "100000000000000000000e-20"),
    # refused: below 1, past int64, not a quantity, an exponent of more than two digits
    *("0", "0Gi", "-1Gi", "999m", "0.999999999", "1e-3", ".5", ".", "-", "+", "", "1e-99"),
    *("9223372036854775808", "9.2233720368547758075e18", "8E", "10E", "1e19", "1e99"),
    *("1e003", "1e2147483647", "1e-2147483647", "1e4294967296", "1e4294967299", "1e4294967295"),
    *("1e", "1e+", "1ei", "1KiB", "1K", "1gb", "1 Gi", " 1Gi", "1Gi ", "1Gi\n", "Gi", "lots"),
    *("1.5.5", "0x10", "1_000", "\uff11", "1e1000000", "1e999999999999999999999"),
)


@st.composite
def _quantity_grammar(draw: st.DrawFn) -> str:
    """A string of ParseQuantity's shape: sign, digits, fraction, suffix or exponent."""
    sign = draw(st.sampled_from(["", "", "", "+", "-"]))
    whole = draw(st.from_regex(r"[0-9]{0,20}", fullmatch=True))
    fraction = draw(st.none() | st.from_regex(r"\.[0-9]{0,12}", fullmatch=True))
    decimal = ["", "n", "u", "m", "k", "M", "G", "T", "P", "E"]
    binary = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]
    wrong = ["K", "i", "KiB", "gb", "e", "E+", "mi", "kk", " "]
    exponent = st.builds(
        "{}{}{}".format,
        st.sampled_from(["e", "E"]),
        st.sampled_from(["", "+", "-"]),
        st.integers(0, 25).map(str) | st.sampled_from(["4294967296", "4294967299", "2147483648"]),
    )
    suffix = draw(st.sampled_from(decimal + binary) | exponent | st.sampled_from(wrong))
    pad = st.sampled_from(["", "", "", "", " ", "\t"])
    return f"{draw(pad)}{sign}{whole}{'' if fraction is None else fraction}{suffix}{draw(pad)}"


quantity_texts = (
    _quantity_grammar()
    | st.sampled_from(QUANTITY_FORMS)
    | st.integers(1, 2**63 - 1).map(str)
    | st.builds("{}e{}".format, st.integers(0, 10**6), st.integers(-9, 15))
)


def _valid(kind: FieldType, driver: str) -> st.SearchStrategy[Any]:
    """Values of `kind` (mostly valid ones: a quantity's grammar draws invalid ones too)."""
    match kind:
        case Const():
            return st.just(kind.expected(driver))
        case OneOf():
            return st.sampled_from(kind.values)
        case Integer():
            return st.integers(kind.minimum, kind.maximum) | st.sampled_from(
                [kind.minimum, kind.maximum]
            )
        case Quantity():
            return quantity_texts
        case Pattern():
            return st.from_regex(kind.regex, fullmatch=True)
        case Object():
            return _objects(kind, driver)


def _invalid(kind: FieldType, driver: str) -> st.SearchStrategy[Any]:
    """Values that are not of `kind`: near misses, edges, other types, any JSON."""
    match kind:
        case Const():
            expected = kind.expected(driver)
            others = [expected.upper(), f"{driver}/v1", "gpu.dra-suite.io/v1alpha1", "", " "]
            return st.sampled_from(others) | any_json
        case OneOf():
            others = [v.lower() for v in kind.values] + ["", "Fair", f"{kind.values[0]} "]
            return st.sampled_from(others) | any_json
        case Integer():
            low, high = kind.minimum, kind.maximum
            return (
                st.sampled_from([low - 1, high + 1, 0, -1, *_INT64])
                | st.integers(*_INT64)
                | st.integers(low, high).map(float)
                | st.booleans()
                | st.integers(low, high).map(str)
                | any_json
            )
        case Quantity():
            return quantity_texts | any_json
        case Pattern():
            edges = ["a" * 64, "a-", "-a", "a\n", "", "1g 10gb", "a/b"]
            return st.sampled_from(edges) | st.text(max_size=70) | any_json
        case Object():
            return any_json


_MOSTLY = st.sampled_from([True] * 9 + [False])
_OFTEN = st.sampled_from([True, True, False])


@st.composite
def _draw_object(
    draw: st.DrawFn, kind: Object, driver: str, focus: tuple[str, ...] = ()
) -> dict[str, Any]:
    """An object of `kind`, its fields mostly valid; with a `focus` path, the object there is
    always drawn (and the strategy its block needs set), so deep fields are drawn as often."""
    focused = kind.field(focus[0]) if focus else None
    forced = {} if focused is None or focused.only_with is None else dict([focused.only_with])
    document: dict[str, Any] = {}
    for field in kind.fields:
        if field is focused:
            assert isinstance(field.type, Object)
            document[field.name] = draw(_draw_object(field.type, driver, focus[1:]))
        elif field.name in forced:
            document[field.name] = forced[field.name]
        elif draw(_MOSTLY if field.required else _OFTEN):
            value = _valid if draw(_MOSTLY) else _invalid
            document[field.name] = draw(value(field.type, driver))
    if draw(_MOSTLY):  # mostly drop blocks whose sibling (a strategy) does not allow them
        for field in kind.fields:
            if field.only_with is not None and field.name in document and field is not focused:
                sibling, wanted = field.only_with
                if document.get(sibling, kind.field(sibling).default) != wanted:
                    del document[field.name]
    if not draw(_MOSTLY):
        unknown = st.sampled_from(["extra", "Sharing", "apiversion", "status"]) | st.text(
            max_size=6
        )
        document[draw(unknown)] = draw(any_json)
    return document


def _objects(kind: Object, driver: str) -> st.SearchStrategy[dict[str, Any]]:
    return _draw_object(kind, driver)


def object_paths(kind: Object = DEVICE_CONFIG, path: str = "") -> list[str]:
    """The path of every object in the schema, the document's own ("") first."""
    paths = [path]
    for field in kind.fields:
        if isinstance(field.type, Object):
            paths += object_paths(field.type, f"{path}.{field.name}" if path else field.name)
    return paths


def parameters(driver: str, focus: str = "") -> st.SearchStrategy[Any]:
    """One `opaque.parameters` value: mostly DeviceConfig-shaped, sometimes any JSON at all;
    with a `focus`, always one with the object at that path (`sharing.timeSlicing`)."""
    shaped = _draw_object(DEVICE_CONFIG, driver, tuple(focus.split(".")) if focus else ())
    return _MOSTLY.flatmap(lambda s: shaped if s or focus else any_json)


_WRONG_TYPES: tuple[Any, ...] = (None, True, 1, 1.5, "x", [], {})


def _edges(kind: FieldType, driver: str) -> tuple[Any, ...]:
    """The values worth trying for `kind`: each bound and one past it, near misses."""
    match kind:
        case Const():
            expected = kind.expected(driver)
            return expected, f"{expected} ", expected.upper(), expected.lower()
        case OneOf():
            return *kind.values, *(v.lower() for v in kind.values), ""
        case Integer():
            low, high = kind.minimum, kind.maximum
            return low - 1, low, low + 1, high - 1, high, high + 1, float(low), str(low), -(2**63)
        case Quantity():
            return QUANTITY_FORMS
        case Pattern():
            return (
                *(kind.example, "a", "a" * 63, "a" * 64, "a-", "-a", "a\n", "a b", "a.b_c+d-e"),
                *("1g.10gb+me", "vir05_1c_8g", "\u00e9"),
            )
        case Object():
            return {}, {"unknown": 1}


def _sample(kind: FieldType, driver: str) -> Any:
    """One valid value of `kind`, with only its required fields."""
    match kind:
        case Const():
            return kind.expected(driver)
        case OneOf():
            return kind.values[0]
        case Integer():
            return kind.minimum
        case Quantity():
            return str(kind.minimum)
        case Pattern():
            return kind.example
        case Object():
            return {f.name: _sample(f.type, driver) for f in kind.fields if f.required}


def edge_cases(driver: str) -> list[tuple[str, Any]]:
    """(id, parameters) per field and edge value: a valid config but for that one field (the
    strategy its block needs set), and every field also of every wrong JSON type."""
    cases: list[tuple[str, Any]] = []

    def walk(kind: Object, path: tuple[str, ...]) -> None:
        for field in kind.fields:
            where = (*path, field.name)
            for value in (*_edges(field.type, driver), *_WRONG_TYPES):
                cases.append((f"{'.'.join(where)}={value!r}", _with(where, value, driver)))
            if isinstance(field.type, Object):
                walk(field.type, where)

    walk(DEVICE_CONFIG, ())
    return cases


def _with(path: tuple[str, ...], value: Any, driver: str) -> dict[str, Any]:
    """A valid config with `value` at `path` (and the strategy a block on the path needs)."""
    document: dict[str, Any] = _sample(DEVICE_CONFIG, driver)
    kind, node = DEVICE_CONFIG, document
    for name in path[:-1]:
        field = kind.field(name)
        if field.only_with is not None:
            node[field.only_with[0]] = field.only_with[1]
        assert isinstance(field.type, Object)
        node[name] = node.get(name) or _sample(field.type, driver)
        kind, node = field.type, node[name]
    field = kind.field(path[-1])
    if field.only_with is not None:
        node[field.only_with[0]] = field.only_with[1]
    node[path[-1]] = value
    return document
