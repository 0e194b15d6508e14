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


def watch(role: str, bucket: str, keys: str, purpose: str = "watch") -> str:
    return N.js_consumer_create(bucket, keys, consumer=N.consumer(role, "node-a", purpose))


OWN_CALLS = {
    "discovery puts its inventory": (
        "discovery",
        N.kv_subject(N.inventory_bucket, inventory("node-a")),
    ),
    "discovery reads its inventory": (
        "discovery",
        N.js_direct_get(N.inventory_bucket, inventory("node-a")),
    ),
    "discovery watches its health": (
        "discovery",
        watch("discovery", N.health_bucket, health("node-a")),
    ),
    "allocation watches its inventory": (
        "allocation",
        watch("allocation", N.inventory_bucket, inventory("node-a")),
    ),
    "the sim monitor watches its inventory": (
        "health",
        watch("health", N.inventory_bucket, inventory("node-a"), "sim"),
    ),
    "allocation deletes its own consumer": (
        "allocation",
        N.js_consumer_delete(N.claims_bucket, N.consumer("allocation", "node-a", "watch")),
    ),
    "allocation writes its claims": (
        "allocation",
        N.kv_subject(N.claims_bucket, N.claim_keys(DRIVER, "node-a")),
    ),
    "health writes its records": ("health", N.kv_subject(N.health_bucket, health("node-a"))),
    "health publishes its alerts": ("health", N.alerts(DRIVER, "node-a")),
    "health opens the alert stream": ("health", N.js_stream_info(N.alerts_stream)),
    "health reads its claims": (
        "health",
        watch("health", N.claims_bucket, N.claim_keys(DRIVER, "node-a")),
    ),
    "health guards its records": (
        "health",
        watch("health", N.health_bucket, health("node-a"), "guard"),
    ),
    "allocation guards its claims": (
        "allocation",
        watch("allocation", N.claims_bucket, N.claim_keys(DRIVER, "node-a"), "guard"),
    ),
    "the operator injects faults anywhere": ("operator", N.control_wildcard),
    "the operator removes stale consumers": ("operator", "$JS.API.CONSUMER.DELETE.>"),
}


@pytest.mark.parametrize(("role", "subject"), OWN_CALLS.values(), ids=OWN_CALLS)
def test_an_agent_may_make_its_own_calls(role: str, subject: str):
    assert subject in grants(role).publish


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
def test_a_node_agent_names_each_consumer_exactly(role: str):
    calls = [s for s in grants(role).publish if s.startswith("$JS.API.CONSUMER.")]
    assert calls
    for subject in calls:
        consumer = subject.split(".")[5]
        assert consumer.startswith(f"{role}-node-a-"), subject
        assert "*" not in consumer, subject
        assert ">" not in consumer, subject


def test_only_the_writer_of_a_bucket_guards_its_keys_there():
    def guarded(role: str) -> set[str]:
        creates = [s.split(".") for s in grants(role).publish if ".CONSUMER.CREATE." in s]
        return {parts[4] for parts in creates if parts[5].endswith("-guard")}

    assert guarded("discovery") == set()
    assert guarded("allocation") == {N.kv_stream(N.claims_bucket)}
    assert guarded("health") == {N.kv_stream(N.health_bucket)}


def test_consumer_names_of_two_nodes_never_meet():
    # A node named like another's name plus a purpose still gets a name of its own.
    assert N.consumer("health", "a-sim", "watch") != N.consumer("health", "a", "sim")
    assert len(N.consumer("discovery", "n" * 253, "watch")) < 255


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


def test_every_identity_subscribes_only_to_its_own_inbox_and_control():
    assert grants("discovery").subscribe == ("_INBOX.discovery.node-a.>",)
    assert grants("health").subscribe == (
        "_INBOX.health.node-a.>",
        N.node_control(DRIVER, "node-a"),
    )
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
