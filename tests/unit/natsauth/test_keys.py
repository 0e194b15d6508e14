"""nkeys and xkeys: interoperable with the `nkeys` package, sealing as the Go nkeys does."""

from __future__ import annotations

import nkeys  # type: ignore[import-untyped]  # ships no type hints
import pytest

from services.natsauth import keys


def test_a_signing_key_has_the_public_key_nkeys_computes():
    seed = keys.new_signing_seed(nkeys.PREFIX_BYTE_ACCOUNT)
    ours = keys.SigningKey.from_seed(seed, nkeys.PREFIX_BYTE_ACCOUNT)
    theirs = nkeys.from_seed(bytearray(seed.encode()))
    assert ours.public == bytes(theirs.public_key).decode()
    assert theirs.verify(b"data", ours.sign(b"data"))


def test_a_seed_of_another_role_is_refused():
    seed = keys.new_signing_seed(nkeys.PREFIX_BYTE_USER)
    with pytest.raises(keys.NKeyError, match="another role"):
        keys.SigningKey.from_seed(seed, nkeys.PREFIX_BYTE_ACCOUNT)


def test_a_corrupted_seed_is_refused():
    seed = keys.new_xkey_seed()
    with pytest.raises(keys.NKeyError):
        keys.XKey.from_seed(seed[:-2] + ("A" if seed[-2] != "A" else "B") + seed[-1])


def test_sealed_data_opens_only_for_its_recipient_from_its_sender():
    server, service, stranger = (keys.XKey.from_seed(keys.new_xkey_seed()) for _ in range(3))
    sealed = keys.seal(b"request", key=server, recipient=service.public)
    assert sealed.startswith(b"xkv1")
    assert keys.open_sealed(sealed, key=service, sender=server.public) == b"request"
    with pytest.raises(keys.SealError):
        keys.open_sealed(sealed, key=stranger, sender=server.public)
    with pytest.raises(keys.SealError):
        keys.open_sealed(sealed, key=service, sender=stranger.public)
    with pytest.raises(keys.SealError, match="version"):
        keys.open_sealed(b"xkv2" + sealed[4:], key=service, sender=server.public)


def test_the_service_opens_requests_of_more_servers_than_it_keeps_boxes_for():
    service = keys.XKey.from_seed(keys.new_xkey_seed())
    servers = [keys.XKey.from_seed(keys.new_xkey_seed()) for _ in range(70)]
    for _ in range(2):  # the second round finds the first servers' boxes gone
        for server in servers:
            sealed = keys.seal(b"request", key=server, recipient=service.public)
            assert keys.open_sealed(sealed, key=service, sender=server.public) == b"request"
            answer = keys.seal(b"answer", key=service, recipient=server.public)
            assert keys.open_sealed(answer, key=server, sender=service.public) == b"answer"


def test_reprs_hold_no_seed():
    seed = keys.new_xkey_seed()
    assert seed not in repr(keys.XKey.from_seed(seed))
