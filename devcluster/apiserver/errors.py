"""Kubernetes `Status` failures and field errors, shaped like kube-apiserver's.

`APIError` is raised anywhere in the emulator and rendered by the HTTP layer;
`FieldError` mirrors apimachinery's field.Error (type, path, body). No I/O here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

__all__ = [
    "APIError",
    "FieldError",
    "already_exists",
    "bad_request",
    "conflict",
    "gone",
    "invalid",
    "method_not_allowed",
    "not_found",
    "status_for_code",
    "too_many_requests",
    "unsupported_media_type",
]

_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Gone",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


class APIError(Exception):
    """A request failure, carried as the `Status` object the server answers with."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        *,
        details: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details
        self.headers = headers or {}

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            body["details"] = self.details
        return body


@dataclass(frozen=True, slots=True)
class FieldError:
    """One field problem; `reason` is the StatusCause reason (e.g. FieldValueTooMany)."""

    reason: str
    field: str
    body: str

    def __str__(self) -> str:
        return f"{self.field}: {self.body}"

    def cause(self) -> dict[str, str]:
        return {"reason": self.reason, "message": self.body, "field": self.field}

    @classmethod
    def required(cls, field: str, detail: str = "") -> FieldError:
        return cls(
            "FieldValueRequired", field, "Required value" + (f": {detail}" if detail else "")
        )

    @classmethod
    def invalid(cls, field: str, value: Any, detail: str) -> FieldError:
        return cls("FieldValueInvalid", field, f"Invalid value: {_repr(value)}: {detail}")

    @classmethod
    def not_supported(cls, field: str, value: Any, valid: list[str]) -> FieldError:
        options = ", ".join(json.dumps(v) for v in valid)
        body = f"Unsupported value: {_repr(value)}: supported values: {options}"
        return cls("FieldValueNotSupported", field, body)

    @classmethod
    def too_many(cls, field: str, actual: int, limit: int) -> FieldError:
        body = f"Too many: {actual}: must have at most {limit} items"
        return cls("FieldValueTooMany", field, body)

    @classmethod
    def too_long(cls, field: str, limit: int) -> FieldError:
        return cls("FieldValueTooLong", field, f"Too long: may not be more than {limit} bytes")

    @classmethod
    def duplicate(cls, field: str, value: Any) -> FieldError:
        return cls("FieldValueDuplicate", field, f"Duplicate value: {_repr(value)}")

    @classmethod
    def forbidden(cls, field: str, detail: str) -> FieldError:
        return cls("FieldValueForbidden", field, f"Forbidden: {detail}")

    @classmethod
    def type_invalid(cls, field: str, value: Any, detail: str) -> FieldError:
        return cls("FieldValueTypeInvalid", field, f"Invalid value: {_repr(value)}: {detail}")


def _repr(value: Any) -> str:
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool | int | float) or value is None:
        return json.dumps(value)
    return '"<object>"' if isinstance(value, dict) else '"<list>"'


def _details(kind: str, group: str, name: str) -> dict[str, Any]:
    details: dict[str, Any] = {"name": name, "kind": kind}
    if group:
        details["group"] = group
    return details


def _qualified(plural: str, group: str) -> str:
    return f"{plural}.{group}" if group else plural


def not_found(plural: str, group: str, name: str) -> APIError:
    message = f'{_qualified(plural, group)} "{name}" not found'
    return APIError(404, "NotFound", message, details=_details(plural, group, name))


def already_exists(plural: str, group: str, name: str) -> APIError:
    message = f'{_qualified(plural, group)} "{name}" already exists'
    return APIError(409, "AlreadyExists", message, details=_details(plural, group, name))


def conflict(plural: str, group: str, name: str, detail: str) -> APIError:
    message = f'Operation cannot be fulfilled on {_qualified(plural, group)} "{name}": {detail}'
    return APIError(409, "Conflict", message, details=_details(plural, group, name))


def invalid(kind: str, group: str, name: str, errors: list[FieldError]) -> APIError:
    qualified = f"{kind}.{group}" if group else kind
    joined = ", ".join(str(e) for e in errors)
    summary = joined if len(errors) == 1 else f"[{joined}]"
    details = _details(kind, group, name)
    details["causes"] = [e.cause() for e in errors]
    return APIError(422, "Invalid", f'{qualified} "{name}" is invalid: {summary}', details=details)


def bad_request(message: str) -> APIError:
    return APIError(400, "BadRequest", message)


def gone(message: str) -> APIError:
    return APIError(410, "Gone", message)


def method_not_allowed(method: str) -> APIError:
    message = f"the server does not allow this method on the requested resource ({method})"
    return APIError(405, "MethodNotAllowed", message)


def unsupported_media_type(content_type: str) -> APIError:
    message = f"the body of the request was in an unknown format - accepted media types include: application/json, application/merge-patch+json, application/strategic-merge-patch+json, application/json-patch+json (got {content_type!r})"  # noqa: E501
    return APIError(415, "UnsupportedMediaType", message)


def too_many_requests(message: str, *, retry_after_s: int) -> APIError:
    details = {"causes": [{"reason": "RetryAfter", "message": message}]}
    details_any: dict[str, Any] = {**details, "retryAfterSeconds": retry_after_s}
    return APIError(
        429,
        "TooManyRequests",
        message,
        details=details_any,
        headers={"Retry-After": str(retry_after_s)},
    )


def status_for_code(code: int, message: str, *, retry_after_s: int = 1) -> APIError:
    """An injected failure with the reason kube-apiserver uses for `code`."""
    if code == 429:
        return too_many_requests(message, retry_after_s=retry_after_s)
    return APIError(code, _REASONS.get(code, "InternalError"), message)
