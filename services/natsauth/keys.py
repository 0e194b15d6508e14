"""NATS nkeys as the auth callout needs them: signing keys (account A..., user U...) and xkeys.

Signing and verification use the `nkeys` package. It has no curve keys (xkeys, `X...`), which
nats-server uses to encrypt callout requests and responses, so those are encoded here with the
same layout (prefix byte, 32 bytes, CRC-16) and sealed with NaCl's box like the Go `nkeys`
(`xkv1` version tag, 24-byte nonce, then the box). No function here logs or keeps a seed.
"""

from __future__ import annotations

import base64
import binascii
import os
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import nacl.exceptions
import nacl.public
import nacl.signing
import nkeys  # type: ignore[import-untyped]  # ships no type hints

__all__ = [
    "CURVE",
    "NKeyError",
    "SealError",
    "SigningKey",
    "XKey",
    "new_signing_seed",
    "new_xkey_seed",
    "open_sealed",
    "public_verify_key",
    "seal",
]

CURVE = 23 << 3  # base32 'X'
_SEED = nkeys.PREFIX_BYTE_SEED
_XKEY_VERSION = b"xkv1"
_NONCE_LEN = 24
_BOXES_KEPT = 64


class NKeyError(ValueError):
    """A seed or public key that does not decode, or is of the wrong role."""


class SealError(ValueError):
    """A sealed message that does not open: wrong version, too short, or not for this key."""


def _crc(data: bytes) -> bytes:
    return bytes(nkeys.crc16_checksum(bytearray(data)))


def _encode(raw: bytes) -> str:
    return base64.b32encode(raw + _crc(raw)).decode().rstrip("=")


def _decode(text: str) -> bytes:
    try:
        padded = text + "=" * (-len(text) % 8)
        data = base64.b32decode(padded)
    except (binascii.Error, ValueError):
        raise NKeyError("not a base32 nkey") from None
    raw, checksum = data[:-2], data[-2:]
    if len(raw) < 33 or _crc(raw) != checksum:
        raise NKeyError("nkey checksum does not match")
    return raw


def _encode_public(prefix: int, key: bytes) -> str:
    return _encode(bytes([prefix]) + key)


def _decode_public(text: str, prefix: int) -> bytes:
    raw = _decode(text)
    if raw[0] != prefix or len(raw) != 33:
        raise NKeyError(f"not a public nkey of the expected role ({text[:1]}...)")
    return raw[1:]


def _encode_seed(prefix: int, key: bytes) -> str:
    header = bytes([_SEED | prefix >> 5, (31 & prefix) << 3])
    return _encode(header + key)


def _decode_seed(text: str, prefix: int) -> bytes:
    raw = _decode(text.strip())
    if len(raw) != 34 or raw[0] & 248 != _SEED:
        raise NKeyError("not an nkey seed")
    role = (raw[0] & 7) << 5 | (raw[1] & 248) >> 3
    if role != prefix:
        raise NKeyError("an nkey seed of another role")
    return raw[2:]


def public_verify_key(public: str, prefix: int) -> nacl.signing.VerifyKey:
    """The ed25519 key of a public nkey of the given role (e.g. the server's N...)."""
    return nacl.signing.VerifyKey(_decode_public(public, prefix))


@dataclass(frozen=True, slots=True)
class SigningKey:
    """An ed25519 nkey with its seed (an account issuing JWTs, or a throwaway user key)."""

    public: str
    _signer: nacl.signing.SigningKey

    @classmethod
    def from_seed(cls, seed: str, prefix: int) -> SigningKey:
        signer = nacl.signing.SigningKey(_decode_seed(seed, prefix))
        return cls(public=_encode_public(prefix, bytes(signer.verify_key)), _signer=signer)

    def sign(self, data: bytes) -> bytes:
        return bytes(self._signer.sign(data).signature)

    def __repr__(self) -> str:
        return f"SigningKey({self.public})"


def new_signing_seed(prefix: int) -> str:
    """A fresh seed of the role `prefix` (nkeys.PREFIX_BYTE_ACCOUNT, ..._USER, ...)."""
    return _encode_seed(prefix, os.urandom(32))


def new_xkey_seed() -> str:
    return _encode_seed(CURVE, bytes(nacl.public.PrivateKey.generate()))


@dataclass(frozen=True, slots=True)
class XKey:
    """A curve25519 key pair (`SX...` seed, `X...` public) that opens and seals callout bodies.

    The box shared with each peer (a server's xkey, the same for its whole life) is computed
    once and kept: the key agreement costs ten times the decryption of a request."""

    public: str
    _private: nacl.public.PrivateKey
    _boxes: OrderedDict[str, nacl.public.Box] = field(
        default_factory=OrderedDict, repr=False, compare=False
    )

    @classmethod
    def from_seed(cls, seed: str) -> XKey:
        private = nacl.public.PrivateKey(_decode_seed(seed, CURVE))
        return cls(public=_encode_public(CURVE, bytes(private.public_key)), _private=private)

    def __repr__(self) -> str:
        return f"XKey({self.public})"


def _box(key: XKey, peer: str) -> nacl.public.Box:
    boxes = key._boxes
    box = boxes.get(peer)
    if box is not None:
        boxes.move_to_end(peer)
        return box
    try:
        box = nacl.public.Box(key._private, nacl.public.PublicKey(_decode_public(peer, CURVE)))
    except NKeyError as exc:
        raise SealError(f"peer xkey: {exc}") from None
    boxes[peer] = box
    while len(boxes) > _BOXES_KEPT:
        boxes.popitem(last=False)
    return box


def seal(data: bytes, *, key: XKey, recipient: str) -> bytes:
    nonce = os.urandom(_NONCE_LEN)
    box: Any = _box(key, recipient)
    return _XKEY_VERSION + bytes(box.encrypt(data, nonce))


def open_sealed(data: bytes, *, key: XKey, sender: str) -> bytes:
    if len(data) <= len(_XKEY_VERSION) + _NONCE_LEN:
        raise SealError("sealed message too short")
    if not data.startswith(_XKEY_VERSION):
        raise SealError("sealed message of an unknown version")
    try:
        return bytes(_box(key, sender).decrypt(data[len(_XKEY_VERSION) :]))
    except nacl.exceptions.CryptoError:
        raise SealError("sealed message does not open with this key") from None
