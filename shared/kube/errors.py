"""Map API server answers and transport failures onto the shared error tree."""

from __future__ import annotations

import json
import math
from typing import Any

from shared.errors import (
    DraSuiteError,
    KubeAlreadyExistsError,
    KubeConflictError,
    KubeError,
    KubeExpiredError,
    KubeInvalidError,
    KubeNotFoundError,
    KubeTransientError,
)

__all__ = ["MAX_RETRY_AFTER_S", "from_status", "status_message"]

MAX_RETRY_AFTER_S = 600.0
"""A longer Retry-After is taken as this: asyncio cannot sleep for 1e308 seconds, and no
writer here should wait longer (each caps it lower still with `Backoff.max_retry_after_s`)."""


def status_message(body: bytes) -> tuple[str, str]:
    """(reason, message) of a `kind: Status` body; falls back to the raw text."""
    try:
        status: Any = json.loads(body)
    except ValueError:
        return "", body.decode(errors="replace")[:300]
    if not isinstance(status, dict):
        return "", str(status)[:300]
    return str(status.get("reason", "")), str(status.get("message", ""))


def from_status(
    status: int, body: bytes, *, what: str, name: str = "", retry_after: str | None = None
) -> DraSuiteError:
    """The error for a non-2xx answer to the request described by `what`."""
    reason, message = status_message(body)
    text = f"{what}: {status} {reason}: {message}".rstrip(": ")
    if status == 404:
        return KubeNotFoundError(text, status=status, reason=reason, name=name)
    if status == 409 and reason == "AlreadyExists":
        return KubeAlreadyExistsError(text, status=status, reason=reason, name=name)
    if status == 409:
        return KubeConflictError(text, name=name)
    if status == 410:
        return KubeExpiredError(text)
    if status in (400, 403, 405, 415, 422):
        return KubeInvalidError(text, status=status, reason=reason, name=name)
    if status == 401:
        return KubeTransientError(text, status=status)  # credentials may be rotating
    retry_after_s = _seconds(retry_after)
    if status == 429 or status >= 500:
        return KubeTransientError(text, status=status, retry_after_s=retry_after_s)
    return KubeError(text, status=status, reason=reason, name=name)


def _seconds(value: str | None) -> float | None:
    """Retry-After in seconds; None when absent or not a finite number (`inf`, `nan`, a date)."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    if not math.isfinite(seconds):
        return None
    return min(max(0.0, seconds), MAX_RETRY_AFTER_S)
