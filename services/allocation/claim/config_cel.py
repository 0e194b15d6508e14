"""The admission policy's CEL for the DeviceConfig schema (pure): what
scripts/gen_admission_policy.py writes into deploy/kustomize/admission/deviceconfig.yaml.

Each object of the schema gets a variable, the list of the well-formed objects at its path in
every config of the request (`variables.at_sharing`); each rule of config_schema.check gets a
validation over such a list, denying with the agent's own words for the field it names
(`invalid opaque config: sharing.strategy: must be one of ...`). A rule never reads below an
object that is not one, so one bad field is one denial, never a CEL error. Quantities use
Kubernetes' CEL quantity library (isQuantity, quantity, isLessThan), which parses as
resource.ParseQuantity does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from services.allocation.claim.config_schema import (
    DEVICE_CONFIG,
    DRIVER,
    Const,
    FieldType,
    Integer,
    Object,
    OneOf,
    Pattern,
    Quantity,
    describe,
)

__all__ = ["PARAMETERS", "Validation", "Variable", "render"]

PARAMETERS = "variables.params"
"""The policy's list of this driver's `opaque.parameters`, each to be one DeviceConfig."""
_PREFIX = "invalid opaque config: "
# `o.name` and has(o.name) need a field name that is a CEL identifier and no reserved word.
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_RESERVED = frozenset(
    {
        *("as", "break", "const", "continue", "else", "false", "for", "function", "if"),
        *("import", "in", "let", "loop", "package", "namespace", "null", "return", "true"),
        *("var", "void", "while"),
    }
)


@dataclass(frozen=True, slots=True)
class Variable:
    name: str
    expression: str


@dataclass(frozen=True, slots=True)
class Validation:
    expression: str
    message: str
    """Plain text, or a CEL string expression when `dynamic` (it names the driver)."""
    dynamic: bool = False


def render(schema: Object = DEVICE_CONFIG) -> tuple[list[Variable], list[Validation]]:
    """The variables (after `params`) and validations that check every parameters object."""
    variables = [Variable("documents", f"{PARAMETERS}.filter(p, type(p) == map)")]
    validations = [
        Validation(f"{PARAMETERS}.all(p, type(p) == map)", _say("parameters", "an object"))
    ]
    _object(schema, "documents", "", variables, validations)
    return variables, validations


def _object(
    schema: Object,
    variable: str,
    path: str,
    variables: list[Variable],
    validations: list[Validation],
) -> None:
    objects = f"variables.{variable}"
    known = ", ".join(_string(n) for n in schema.names)
    validations.append(
        Validation(
            f"{objects}.all(o, o.all(k, k in [{known}]))",
            f"{_PREFIX}{path or 'parameters'}: unknown field (known: {', '.join(schema.names)})",
        )
    )
    for field in schema.fields:
        if not _IDENTIFIER.fullmatch(field.name) or field.name in _RESERVED:
            raise ValueError(f"{field.name!r} cannot be selected in CEL: rename it in the schema")
        where = f"{path}.{field.name}" if path else field.name
        value = f"o.{field.name}"
        rule = _rule(field.type, value)
        present = f"has({value}) && {rule}" if field.required else f"!has({value}) || ({rule})"
        validations.append(_validation(f"{objects}.all(o, {present})", where, field.type))
        if field.only_with is not None:
            sibling, wanted = field.only_with
            validations.append(
                Validation(
                    f"{objects}.all(o, !has({value}) || {_is(schema, sibling, wanted)})",
                    f"{_PREFIX}{where}: only allowed with {sibling} {wanted}",
                )
            )
        if isinstance(field.type, Object):
            child = f"at_{where.replace('.', '_')}"
            variables.append(
                Variable(
                    child,
                    f"{objects}.filter(o, has({value}) && type({value}) == map).map(o, {value})",
                )
            )
            _object(field.type, child, where, variables, validations)


def _rule(kind: FieldType, x: str) -> str:
    """A CEL condition that holds exactly when `x` (present) is a valid value of `kind`."""
    match kind:
        case Const():
            return f"type({x}) == string && {x} == {_template(kind.template)}"
        case OneOf():
            values = ", ".join(_string(v) for v in kind.values)
            return f"type({x}) == string && {x} in [{values}]"
        case Integer():
            return f"type({x}) == int && {x} >= {kind.minimum} && {x} <= {kind.maximum}"
        case Quantity():
            # The shape before any quantity function (see Quantity); the value, a fraction
            # dropped, in minimum..maximum: in [minimum, maximum + 1).
            low, high = _string(str(kind.minimum)), _string(str(kind.maximum + 1))
            shape = _string(f"^(?:{kind.shape})$")
            return (
                f"type({x}) == string && {x}.matches({shape}) && isQuantity({x})"
                f" && !quantity({x}).isLessThan(quantity({low}))"
                f" && quantity({x}).isLessThan(quantity({high}))"
            )
        case Pattern():
            return f"type({x}) == string && {x}.matches({_string(f'^(?:{kind.regex})$')})"
        case Object():
            return f"type({x}) == map"


def _is(schema: Object, sibling: str, wanted: str) -> str:
    """CEL: the sibling field, or its default where it is omitted, is `wanted`."""
    value = f"o.{sibling}"
    given = f"(type({value}) == string && {value} == {_string(wanted)})"
    if schema.field(sibling).default == wanted:
        return f"(!has({value}) || {given})"
    return f"(has({value}) && {given})"


def _validation(expression: str, path: str, kind: FieldType) -> Validation:
    if isinstance(kind, Const) and DRIVER in kind.template:
        message = f"{_string(f'{_PREFIX}{path}: must be ')} + {_template(kind.template)}"
        return Validation(expression, message, dynamic=True)
    return Validation(expression, _say(path, describe(kind, DRIVER)))


def _say(path: str, description: str) -> str:
    return f"{_PREFIX}{path}: must be {description}"


def _template(template: str) -> str:
    """A Const's template as a CEL string expression, the driver from `variables.driver`."""
    pieces: list[str] = []
    for index, part in enumerate(template.split(DRIVER)):
        pieces += ["variables.driver"] if index else []
        pieces += [_string(part)] if part else []
    return "(" + " + ".join(pieces) + ")"


def _string(text: str) -> str:
    """A CEL single-quoted string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
