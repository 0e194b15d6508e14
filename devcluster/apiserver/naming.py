"""Name and value syntax checks from apimachinery (DNS names, label keys, semver, quantities).

Each check returns a list of `FieldError` for the given field path. Pure; no I/O.
"""

from __future__ import annotations

import re
from functools import cache

from devcluster.apiserver.errors import FieldError
from shared import quantity as shared_quantity

__all__ = [
    "c_identifier",
    "dns_label",
    "dns_subdomain",
    "driver_name",
    "label_name",
    "label_value",
    "pool_name",
    "qualified_name",
    "quantity",
    "semver",
]

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(-(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(\.(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*)?"
    r"(\+[0-9a-zA-Z-]+(\.[0-9a-zA-Z-]+)*)?$"
)

_LABEL_MSG = (
    "a DNS-1123 label must consist of lower case alphanumeric characters or '-', and must "
    "start and end with an alphanumeric character"
)
_SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' "
    "or '.', and must start and end with an alphanumeric character"
)
_C_ID_MSG = (
    "a valid C identifier must start with alphabetic character or '_', followed by a string "
    "of alphanumeric characters or '_'"
)


def dns_label(path: str, value: str) -> list[FieldError]:
    if not value:
        return [FieldError.required(path)]
    if len(value) > 63:
        return [FieldError.too_long(path, 63)]
    return [] if _DNS_LABEL.match(value) else [FieldError.invalid(path, value, _LABEL_MSG)]


def dns_subdomain(path: str, value: str, *, limit: int = 253) -> list[FieldError]:
    if not value:
        return [FieldError.required(path)]
    if len(value) > limit:
        return [FieldError.too_long(path, limit)]
    return [] if _DNS_SUBDOMAIN.match(value) else [FieldError.invalid(path, value, _SUBDOMAIN_MSG)]


def driver_name(path: str, value: str) -> list[FieldError]:
    """A driver name or attribute domain: ≤63, a DNS subdomain after lower-casing."""
    if not value:
        return [FieldError.required(path)]
    if len(value) > 63:
        return [FieldError.too_long(path, 63)]
    return dns_subdomain(path, value.lower())


def pool_name(path: str, value: str) -> list[FieldError]:
    if not value:
        return [FieldError.required(path)]
    if len(value) > 253:
        return [FieldError.too_long(path, 253)]
    for part in value.split("/"):
        if not part or not _DNS_SUBDOMAIN.match(part):
            detail = "must be one or more DNS sub-domains separated by slashes"
            return [FieldError.invalid(path, value, detail)]
    return []


def c_identifier(path: str, value: str, *, limit: int = 32) -> list[FieldError]:
    if not value:
        return [FieldError.required(path)]
    if len(value) > limit:
        return [FieldError.too_long(path, limit)]
    return [] if _C_IDENTIFIER.match(value) else [FieldError.invalid(path, value, _C_ID_MSG)]


@cache
def _qualified_ok(value: str) -> bool:
    domain, sep, ident = value.rpartition("/")
    if "/" in domain or not ident or len(ident) > 32 or not _C_IDENTIFIER.match(ident):
        return False
    return not sep or (0 < len(domain) <= 63 and bool(_DNS_SUBDOMAIN.match(domain.lower())))


def qualified_name(path: str, value: str) -> list[FieldError]:
    """Attribute/capacity key: `<C identifier>` or `<domain>/<C identifier>`."""
    if _qualified_ok(value):
        return []
    if value.count("/") > 1:
        return [FieldError.invalid(path, value, "a qualified name must not have more than one /")]
    domain, sep, ident = value.rpartition("/")
    errors = c_identifier(path, ident)
    if sep:
        errors += driver_name(path, domain)
    return errors


def label_name(path: str, value: str) -> list[FieldError]:
    """A label key: optional DNS-subdomain prefix and `/`, then a name ≤63."""
    prefix, sep, name = value.rpartition("/")
    errors: list[FieldError] = []
    if sep:
        errors += dns_subdomain(path, prefix)
    if not name:
        return [*errors, FieldError.required(path, "name part must be non-empty")]
    if len(name) > 63:
        return [
            *errors,
            FieldError.invalid(path, value, "name part must be no more than 63 characters"),
        ]
    if not _LABEL_NAME.match(name):
        detail = "name part must consist of alphanumeric characters, '-', '_' or '.'"
        errors.append(FieldError.invalid(path, value, detail))
    return errors


def label_value(path: str, value: str) -> list[FieldError]:
    if not value:
        return []
    if len(value) > 63:
        return [FieldError.invalid(path, value, "must be no more than 63 characters")]
    if not _LABEL_NAME.match(value):
        detail = "a valid label must be an empty string or consist of alphanumeric characters"
        return [FieldError.invalid(path, value, detail)]
    return []


def semver(path: str, value: str) -> list[FieldError]:
    if len(value) > 64:
        return [FieldError.too_long(path, 64)]
    if not _SEMVER.match(value):
        detail = "must be a string compatible with semver.org spec 2.0.0"
        return [FieldError.invalid(path, value, detail)]
    return []


def quantity(path: str, value: object) -> list[FieldError]:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return []
    try:
        shared_quantity.parse_quantity(value)  # type: ignore[arg-type]
    except shared_quantity.QuantityError as exc:
        return [FieldError.invalid(path, value, exc.reason)]
    return []
