"""Bounds on what a kubelet request makes the plugin echo back: names in errors and logs, and
the size of a whole answer (pure).

The kubelet's names reach us unchecked (a 2 MiB claim name arrives as sent) and come back in
errors, log lines and spans. `clip` cuts such a value to a length a message can carry, saying
how long it was. `bound_errors` shortens the per-claim errors of one answer until the answer
fits the kubelet's gRPC receive limit (4 MiB): one claim's error must never cost the answers
of the others in the call.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

__all__ = ["KUBELET_MAX_MESSAGE_BYTES", "MAX_ERROR_CHARS", "bound_errors", "clip"]

KUBELET_MAX_MESSAGE_BYTES = 4 * 2**20
"""grpc-go's default receive limit, which the kubelet's DRA client keeps."""
MAX_ERROR_CHARS = 2048
"""The longest error one claim's answer carries."""
_ANSWER_MARGIN_BYTES = 64 * 2**10
"""Room left below the limit for map entry framing and the gRPC message header."""
_SHORTEST_ERROR_CHARS = 16


class _Answer(Protocol):
    error: str


def clip(text: str, limit: int = 253) -> str:
    """`text` when at most `limit` characters, else its start and how long it was."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}...({len(text)} chars)"


def bound_errors(
    answers: Iterable[_Answer],
    *,
    size: int,
    limit: int = KUBELET_MAX_MESSAGE_BYTES - _ANSWER_MARGIN_BYTES,
) -> None:
    """Shorten the errors of `answers` (the claims of one response of `size` bytes) so that
    the response fits in `limit` bytes: each to `MAX_ERROR_CHARS`, then all to one length."""
    failed = [answer for answer in answers if answer.error]
    for answer in failed:
        before = len(answer.error.encode())
        if before > MAX_ERROR_CHARS:
            answer.error = _shortened(answer.error, MAX_ERROR_CHARS)
            size -= before - len(answer.error.encode())
    if size <= limit or not failed:
        return
    error_bytes = sum(len(answer.error.encode()) for answer in failed)
    room = max(_SHORTEST_ERROR_CHARS, (limit - (size - error_bytes)) // len(failed))
    for answer in failed:
        answer.error = _shortened(answer.error, room)


def _shortened(error: str, chars: int) -> str:
    """At most `chars` characters (and about as many bytes): an error is mostly ASCII."""
    if len(error.encode()) <= chars:
        return error
    cut = error.encode()[: max(chars - 3, 1)].decode(errors="ignore")
    return cut + "..."
