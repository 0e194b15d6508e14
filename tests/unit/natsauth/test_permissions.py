"""What each bus identity is granted: its own node's subjects, the calls its agent makes."""

from __future__ import annotations

import pytest

from devcluster.natsauth import APP_MAX_PAYLOAD, APP_MAX_SUBSCRIPTIONS
from services.natsauth import permissions
from services.natsauth.identity import Identity
from shared.bus.subjects import Names

DRIVER = "sim.dra-suite.io"
N = Names("")


def grants(role: str, node: str = "node-a", names: Names = N) -> permissions.Permissions:
    return permissions.for_identity(Identity(role=role, node=node), drivers=[DRIVER], names=names)


def inventory(node: str) -> str:
    return N.inventory_key(DRIVER, node)


def health(node: str) -> str:
    return N.health_keys(DRIVER, node)


def follows(bucket: str, keys: str) -> str:
    return N.kv_followed(bucket, keys)


OWN_CALLS = {
    "discovery puts its inventory": (
        "discovery",
        N.kv_subject(N.inventory_bucket, inventory("node-a")),
    ),
    "discovery reads its inventory": (
        "discovery",
        N.js_direct_get(N.inventory_bucket, inventory("node-a")),
    ),
    "discovery reads its health records": (
        "discovery",
        N.js_direct_get(N.health_bucket, health("node-a")),
    ),
    "allocation lists its claims": ("allocation", N.js_stream_info(N.kv_stream(N.claims_bucket))),
    "allocation writes its claims": (
        "allocation",
        N.kv_subject(N.claims_bucket, N.claim_keys(DRIVER, "node-a")),
    ),
    "health writes its records": ("health", N.kv_subject(N.health_bucket, health("node-a"))),
    "health publishes its alerts": ("health", N.alerts(DRIVER, "node-a")),
    "health opens the alert stream": ("health", N.js_stream_info(N.alerts_stream)),
    "health reads its claims": (
        "health",
        N.js_direct_get(N.claims_bucket, N.claim_keys(DRIVER, "node-a")),
    ),
    "the operator injects faults anywhere": ("operator", N.control_wildcard),
    "the operator removes stale consumers": ("operator", "$JS.API.CONSUMER.DELETE.>"),
}

OWN_FOLLOWS = {
    "discovery follows its inventory": (
        "discovery",
        follows(N.inventory_bucket, inventory("node-a")),
    ),
    "discovery follows its health records": (
        "discovery",
        follows(N.health_bucket, health("node-a")),
    ),
    "allocation follows its inventory": (
        "allocation",
        follows(N.inventory_bucket, inventory("node-a")),
    ),
    "allocation follows its claims": (
        "allocation",
        follows(N.claims_bucket, N.claim_keys(DRIVER, "node-a")),
    ),
    "health follows its inventory": ("health", follows(N.inventory_bucket, inventory("node-a"))),
    "health follows its records": ("health", follows(N.health_bucket, health("node-a"))),
    "health follows its claims": (
        "health",
        follows(N.claims_bucket, N.claim_keys(DRIVER, "node-a")),
    ),
    "health hears of a new claims leader": (
        "health",
        N.js_leader_elected(N.kv_stream(N.claims_bucket)),
    ),
}


@pytest.mark.parametrize(("role", "subject"), OWN_CALLS.values(), ids=OWN_CALLS)
def test_an_agent_may_make_its_own_calls(role: str, subject: str):
    assert subject in grants(role).publish


@pytest.mark.parametrize(("role", "subject"), OWN_FOLLOWS.values(), ids=OWN_FOLLOWS)
def test_an_agent_may_follow_its_own_keys(role: str, subject: str):
    assert subject in grants(role).subscribe


def test_no_node_agent_is_granted_anything_of_another_node():
    for role in ("discovery", "allocation", "health"):
        granted = grants(role)
        subjects = [*granted.publish, *granted.subscribe]
        assert not [s for s in subjects if "node-b" in s], role
        assert not [s for s in subjects if s.endswith(">") and "node-a" not in s], role


@pytest.mark.parametrize("role", ["discovery", "allocation", "health", "operator"])
def test_nobody_may_create_update_delete_or_purge_a_stream(role: str):
    denied = grants(role).claims()["pub"]["deny"]
    for api in ("CREATE", "UPDATE", "DELETE", "PURGE", "MSG.DELETE"):
        assert f"$JS.API.STREAM.{api}.>" in denied
    assert not [s for s in grants(role).publish if s.startswith("$JS.API.STREAM.CREATE")]


def test_only_the_provisioner_shapes_streams_and_it_touches_no_message():
    granted = grants(permissions.PROVISIONER, node="")
    streams = [N.kv_stream(bucket) for bucket in N.buckets] + [N.alerts_stream]
    for stream in streams:
        assert f"$JS.API.STREAM.UPDATE.{stream}" in granted.publish
        assert f"$JS.API.STREAM.CREATE.{stream}" in granted.publish
    assert not [s for s in granted.publish if not s.startswith("$JS.API.")]
    assert "$JS.API.STREAM.PURGE.>" in granted.deny_publish


@pytest.mark.parametrize("role", ["discovery", "allocation", "health"])
def test_a_node_agent_holds_no_consumer(role: str):
    assert not [s for s in grants(role).publish if s.startswith("$JS.API.CONSUMER.")]


@pytest.mark.parametrize("role", ["discovery", "allocation", "health", "operator", "auditor"])
def test_only_the_server_publishes_republished_copies_and_advisories(role: str):
    denied = grants(role, node="node-a" if role != "operator" else "").claims()["pub"]["deny"]
    assert "dra.kv.*.>" in denied
    assert "$JS.EVENT.>" in denied
    assert not [s for s in grants(role).publish if s.startswith(("dra.kv.", "$JS.EVENT."))]


def test_the_auditor_names_its_consumer_exactly():
    calls = [s for s in grants(permissions.AUDITOR).publish if ".CONSUMER." in s]
    assert calls
    assert {s.split(".")[5] for s in calls} == {"auditor-node-a-watch"}


def test_consumer_names_of_two_owners_never_meet():
    # An owner named like another's name plus a purpose still gets a name of its own.
    assert N.consumer("auditor", "a-sim", "watch") != N.consumer("auditor", "a", "sim")
    assert len(N.consumer("auditor", "n" * 253, "watch")) < 255


def test_every_user_jwt_is_limited():
    for role in ("discovery", "operator", permissions.PROVISIONER):
        claims = grants(role).claims()
        assert all(claims[limit] > 0 for limit in ("subs", "data", "payload")), role


@pytest.mark.parametrize(
    "role", ["discovery", "allocation", "health", "operator", permissions.PROVISIONER,
             permissions.CERTIFIER],
)  # fmt: skip
def test_no_user_jwt_claims_more_than_the_account_holds_every_connection_to(role: str):
    # nats-server applies the account's per-connection limits to callout users, not the JWT's.
    claims = grants(role).claims()
    assert claims["subs"] <= APP_MAX_SUBSCRIPTIONS
    assert claims["payload"] <= APP_MAX_PAYLOAD


def test_every_identity_subscribes_only_to_its_inbox_control_and_own_keys():
    def elected(bucket: str) -> str:
        return N.js_leader_elected(N.kv_stream(bucket))

    assert grants("discovery").subscribe == (
        "_INBOX.discovery.node-a.>",
        N.kv_followed(N.inventory_bucket, inventory("node-a")),
        elected(N.inventory_bucket),
        N.kv_followed(N.health_bucket, health("node-a")),
        elected(N.health_bucket),
    )
    assert set(grants("health").subscribe) == {
        "_INBOX.health.node-a.>",
        N.node_control(DRIVER, "node-a"),
        *(elected(bucket) for bucket in N.buckets),
        N.kv_followed(N.inventory_bucket, inventory("node-a")),
        N.kv_followed(N.health_bucket, health("node-a")),
        N.kv_followed(N.claims_bucket, N.claim_keys(DRIVER, "node-a")),
    }
    assert grants("operator").subscribe == ("_INBOX.operator.>",)


def test_only_the_health_agent_may_answer_requests():
    assert grants("health").claims()["resp"] == {"max": 1, "ttl": 0}
    assert "resp" not in grants("allocation").claims()


def test_the_bus_namespace_prefixes_every_subject_and_bucket():
    names = Names("t1")
    granted = grants("health", names=names)
    assert "t1._INBOX.health.node-a.>" in granted.subscribe
    assert names.kv_subject("t1_dra_health", health("node-a")) in granted.publish
    assert "t1.dra.alerts.sim_dra-suite_io.node-a" in granted.publish


def test_dots_in_node_names_stay_within_one_token():
    granted = grants("discovery", node="gpu-7.rack-2")
    assert N.kv_subject(N.inventory_bucket, "sim_dra-suite_io.gpu-7_rack-2") in granted.publish
