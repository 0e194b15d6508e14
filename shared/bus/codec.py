"""Encoding of bus messages: binary protobuf for agent-to-agent, proto3 JSON for ops alerts.

Decoding binary protobuf is strict about one thing the parser lets pass: a field number the
schema knows, arriving with another wire type. That is never schema evolution (a field keeps
its type for life) but the bytes of another message type, which protobuf would otherwise
parse into a "valid" message of this type (a health record read as an empty inventory).
Unknown field numbers (newer senders) stay accepted.
"""

from __future__ import annotations

from typing import TypeVar

from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message
from google.protobuf.unknown_fields import UnknownFieldSet

from shared.errors import MalformedMessageError

__all__ = ["decode", "decode_json", "encode", "encode_json"]

M = TypeVar("M", bound=Message)


def encode(message: Message) -> bytes:
    # Deterministic so that equal messages give equal bytes (change detection compares bytes).
    return message.SerializeToString(deterministic=True)


def decode(cls: type[M], data: bytes, *, subject: str) -> M:
    message = cls()
    try:
        message.ParseFromString(data)
    except DecodeError as exc:
        raise MalformedMessageError(
            f"{subject}: not a {cls.DESCRIPTOR.full_name}: {exc}", subject=subject
        ) from exc
    if _has_unknown_fields(message) and (mistyped := _mistyped_field(message)):
        raise MalformedMessageError(
            f"{subject}: not a {cls.DESCRIPTOR.full_name}: {mistyped} has the wrong wire type",
            subject=subject,
        )
    return message


def _has_unknown_fields(message: Message) -> bool:
    """Whether any unknown field hides anywhere in `message` (cheap: no Python-level walk)."""
    known_only = type(message)()
    known_only.CopyFrom(message)
    known_only.DiscardUnknownFields()
    return known_only.ByteSize() != message.ByteSize()


def _mistyped_field(message: Message) -> str | None:
    """The path of the first known field that arrived with another wire type, if any."""
    known = message.DESCRIPTOR.fields_by_number
    unknowns = UnknownFieldSet(message)
    for index in range(len(unknowns)):
        if unknowns[index].field_number in known:
            return known[unknowns[index].field_number].name
    for field, value in message.ListFields():
        entry = field.message_type
        if entry is None:
            continue
        if entry.GetOptions().map_entry:
            if entry.fields_by_name["value"].message_type is None:
                continue
            items = list(value.values())
        else:
            items = list(value) if field.is_repeated else [value]
        for item in items:
            if inner := _mistyped_field(item):
                return f"{field.name}.{inner}"
    return None


def encode_json(message: Message) -> bytes:
    return json_format.MessageToJson(
        message, indent=None, sort_keys=True, always_print_fields_with_no_presence=True
    ).encode()


def decode_json(cls: type[M], data: bytes, *, subject: str) -> M:
    message = cls()
    if not data.lstrip().startswith(b"{"):  # json_format reads `[]` or `"x"` as an empty message
        raise MalformedMessageError(
            f"{subject}: not a {cls.DESCRIPTOR.full_name} JSON document: not a JSON object",
            subject=subject,
        )
    try:
        json_format.Parse(data, message, ignore_unknown_fields=True)
    except (json_format.ParseError, UnicodeDecodeError) as exc:
        raise MalformedMessageError(
            f"{subject}: not a {cls.DESCRIPTOR.full_name} JSON document: {exc}", subject=subject
        ) from exc
    return message
