"""The pieces that keep a flood off the API server: the issuer's key set (refresh on an
unknown key ID, at most once per interval), the review cache and the per-source limit."""

from __future__ import annotations

import pytest

from devcluster.apiserver.tokensigner import TokenIssuer
from services.natsauth.keyset import IssuerKeys
from services.natsauth.ratelimit import SourceLimiter
from services.natsauth.reviewcache import ReviewCache
from shared.errors import DraSuiteError
from tests.unit.natsauth.issuer import Cluster

NOW = 1_900_000_000


async def test_a_rotated_key_is_fetched_when_a_token_names_it():
    cluster, clock = Cluster(now=NOW), [0.0]
    keys = IssuerKeys(cluster.fetch, min_refresh_s=10, clock=lambda: clock[0])
    old = cluster.signer.key_id
    assert await keys.key(old) is not None
    cluster.signer = TokenIssuer(clock=lambda: NOW)  # the API server's new key
    new = cluster.signer.key_id
    assert await keys.key(new) is None  # fetched 0 s ago: not again yet
    clock[0] = 11
    assert await keys.key(new) is not None
    assert await keys.key(old) is None
    assert cluster.fetched.count("/openid/v1/jwks") == 2


async def test_an_unreachable_api_server_is_asked_once_per_interval():
    cluster, clock = Cluster(now=NOW), [0.0]
    cluster.down = True
    keys = IssuerKeys(cluster.fetch, min_refresh_s=10, clock=lambda: clock[0])
    for _ in range(20):
        with pytest.raises(DraSuiteError):
            await keys.key("any")
    assert len(cluster.fetched) == 1
    cluster.down, clock[0] = False, 10
    assert await keys.key(cluster.signer.key_id) is not None


def test_the_cache_honours_expiry_ttl_and_its_bound():
    cache = ReviewCache(max_entries=2, ttl_s=60)
    cache.put("a", {"n": 1}, node="node-a", expires_at=NOW + 10, now=NOW)
    assert cache.get("a", now=NOW + 9) == {"n": 1}
    assert cache.get("a", now=NOW + 10) is None  # the token expired
    cache.put("b", {"n": 2}, node="node-b", expires_at=NOW + 3600, now=NOW)
    assert cache.get("b", now=NOW + 59) is not None
    assert cache.get("b", now=NOW + 60) is None  # reviewed again after ttl
    for token in ("c", "d", "e"):
        cache.put(token, {}, node="node-c", expires_at=NOW + 3600, now=NOW)
    assert len(cache) == 2
    assert cache.get("c", now=NOW) is None  # least recently used out first
    cache.drop_node("node-c")
    assert len(cache) == 0


def test_each_source_has_its_own_bucket():
    limiter = SourceLimiter(rate_per_s=2, burst=3, max_sources=2)
    assert [limiter.allow("a", now=0) for _ in range(4)] == [True, True, True, False]
    assert limiter.allow("b", now=0)
    assert limiter.allow("a", now=0.5)  # refilled one
    assert not limiter.allow("a", now=0.5)
