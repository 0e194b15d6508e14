"""What signed-record settings name (pure): the `--bus-signatures` modes, and the auth key
(`O...`) that verifies writer certificates, read from `--bus-auth-key-file`.

The records themselves are signed and checked in shared/bus/signing.py.
"""

from __future__ import annotations

import base64
import binascii

import nacl.bindings
import nacl.signing
import nkeys  # type: ignore[import-untyped]  # ships no type hints

__all__ = [
    "ACCEPT",
    "AUTH_KEY_PREFIX",
    "ENFORCE",
    "MODES",
    "OFF",
    "decode_auth_key",
    "encode_auth_key",
]

OFF, ACCEPT, ENFORCE = "off", "accept", "enforce"
MODES = (OFF, ACCEPT, ENFORCE)
"""`--bus-signatures`: off (no signing, no checks: the open bus), accept (sign; verify what is
signed, take unsigned records but count them), enforce (drop every record not signed right)."""

AUTH_KEY_PREFIX = nkeys.PREFIX_BYTE_OPERATOR
"""The auth key is written as an operator nkey (`O...`, seed `SO...`)."""

_KEY_BYTES = nacl.bindings.crypto_sign_PUBLICKEYBYTES

# The auth key as an nkey (base32 of prefix byte, 32 key bytes, CRC-16), like the Secret's
# other public keys.


def encode_auth_key(public: bytes) -> str:
    raw = bytes([AUTH_KEY_PREFIX]) + public
    checksum = bytes(nkeys.crc16_checksum(bytearray(raw)))
    return base64.b32encode(raw + checksum).decode().rstrip("=")


def decode_auth_key(text: str) -> nacl.signing.VerifyKey:
    """The ed25519 key of an auth key `O...`; ValueError when it is none."""
    text = text.strip()
    try:
        data = base64.b32decode(text + "=" * (-len(text) % 8))
    except (binascii.Error, ValueError):
        raise ValueError("the auth key is not a base32 nkey") from None
    raw, checksum = data[:-2], data[-2:]
    if len(raw) != 1 + _KEY_BYTES or bytes(nkeys.crc16_checksum(bytearray(raw))) != checksum:
        raise ValueError("the auth key's checksum or length is wrong")
    if raw[0] != AUTH_KEY_PREFIX:
        raise ValueError("the auth key is not an operator nkey (O...)")
    return nacl.signing.VerifyKey(raw[1:])
