"""The callout wire format: server requests verified by their signature, responses and user
JWTs signed by the issuer as nats-server expects them."""

from __future__ import annotations

from typing import Any

import nkeys  # type: ignore[import-untyped]  # ships no type hints
import pytest

from services.natsauth import callout, nkeyjwt
from services.natsauth.keys import SigningKey, new_signing_seed
from services.natsauth.permissions import Permissions

SERVER = SigningKey.from_seed(new_signing_seed(nkeys.PREFIX_BYTE_SERVER), nkeys.PREFIX_BYTE_SERVER)
ISSUER = SigningKey.from_seed(
    new_signing_seed(nkeys.PREFIX_BYTE_ACCOUNT), nkeys.PREFIX_BYTE_ACCOUNT
)
USER = SigningKey.from_seed(new_signing_seed(nkeys.PREFIX_BYTE_USER), nkeys.PREFIX_BYTE_USER)


def request_claims(**nats: Any) -> dict[str, Any]:
    body = {
        "server_id": {"id": SERVER.public, "name": "n1", "xkey": ""},
        "user_nkey": USER.public,
        "client_info": {"host": "10.0.0.7", "kind": "Client"},
        "connect_opts": {"auth_token": "the-token", "name": "dra-health/node-a"},
        "type": "authorization_request",
        "version": 2,
    }
    return {"aud": "nats-authorization-request", "sub": USER.public, "nats": {**body, **nats}}


def test_a_request_signed_by_its_server_is_read():
    request = callout.parse_request(nkeyjwt.encode(request_claims(), signer=SERVER))
    assert request == callout.AuthRequest(
        server_id=SERVER.public,
        user_nkey=USER.public,
        token="the-token",
        client_name="dra-health/node-a",
        client_host="10.0.0.7",
    )


def _tampered() -> str:
    header, _, signature = nkeyjwt.encode(request_claims(), signer=SERVER).split(".")
    other = nkeyjwt.encode(request_claims(connect_opts={"auth_token": "x"}), signer=SERVER)
    return ".".join([header, other.split(".")[1], signature])


OTHER_SERVER = SigningKey.from_seed(
    new_signing_seed(nkeys.PREFIX_BYTE_SERVER), nkeys.PREFIX_BYTE_SERVER
)
BAD_REQUESTS = {
    "not a JWT": "garbage",
    "a payload the signature does not cover": _tampered(),
    "signed by an account, not a server": nkeyjwt.encode(request_claims(), signer=ISSUER),
    "signed by another server than it names": nkeyjwt.encode(request_claims(), signer=OTHER_SERVER),
    "another audience": nkeyjwt.encode({**request_claims(), "aud": "x"}, signer=SERVER),
    "another type": nkeyjwt.encode(request_claims(type="user"), signer=SERVER),
    "no user key": nkeyjwt.encode(request_claims(user_nkey=None), signer=SERVER),
}


@pytest.mark.parametrize("token", BAD_REQUESTS.values(), ids=BAD_REQUESTS)
def test_a_bad_request_is_refused(token: str):
    with pytest.raises(callout.CalloutError):
        callout.parse_request(token)


def test_peeking_reads_what_parsing_reads_but_checks_no_signature():
    signed = nkeyjwt.encode(request_claims(), signer=SERVER)
    assert callout.peek_request(signed) == callout.parse_request(signed)
    # Fit to sort requests by, never to admit: a tampered one still reads.
    assert callout.peek_request(_tampered()).token == "x"
    with pytest.raises(callout.CalloutError):
        callout.peek_request("garbage")


def test_the_user_response_admits_the_client_into_the_account_until_expiry():
    request = callout.parse_request(nkeyjwt.encode(request_claims(), signer=SERVER))
    grants = Permissions(publish=("a",), subscribe=("_INBOX.x.>",), allow_responses=True)
    token = callout.user_response(
        request, grants, name="health/node-a", account="DRA", expires_at=2_000_000_000,
        issuer=ISSUER, now=1_900_000_000,
    )  # fmt: skip
    response = nkeyjwt.verify(token, issuer=ISSUER.public, prefix=nkeys.PREFIX_BYTE_ACCOUNT)
    assert response["aud"] == SERVER.public
    assert response["sub"] == USER.public
    assert response["nats"]["type"] == "authorization_response"
    user = nkeyjwt.verify(
        response["nats"]["jwt"], issuer=ISSUER.public, prefix=nkeys.PREFIX_BYTE_ACCOUNT
    )
    assert (user["aud"], user["sub"], user["exp"]) == ("DRA", USER.public, 2_000_000_000)
    assert user["nats"]["pub"]["allow"] == ["a"]
    assert user["nats"]["sub"]["allow"] == ["_INBOX.x.>"]
    assert user["nats"]["resp"] == {"max": 1, "ttl": 0}


def test_the_error_response_carries_the_reason_and_no_user():
    request = callout.parse_request(nkeyjwt.encode(request_claims(), signer=SERVER))
    token = callout.error_response(request, "not authorized: no_token", issuer=ISSUER, now=1)
    response = nkeyjwt.verify(token, issuer=ISSUER.public, prefix=nkeys.PREFIX_BYTE_ACCOUNT)
    assert response["nats"]["error"] == "not authorized: no_token"
    assert "jwt" not in response["nats"]
