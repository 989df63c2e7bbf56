"""The simulated replicas' KV events feed the router's KvIndex (kv_aware's view in simulation)."""

from __future__ import annotations

import pytest

from sessionroute.errors import ConfigError
from sessionroute.replica import EngineRequest, ReplicaConfig
from sessionroute.replica.api import chain_block_keys
from sessionroute.replica.profiles import PROFILES
from sessionroute.router.kv.index import KvIndex
from sessionroute.sim.kvview import KvEventFeed, SaltedIndexView
from sessionroute.sim.replicas import SimReplica


@pytest.mark.parametrize("fast", [True, False])
def test_events_feed_the_index_per_replica_and_salt(fast: bool) -> None:
    profile = sorted(PROFILES.values(), key=lambda p: p.name)[0]
    config = ReplicaConfig(profile, block_size=4, kv_capacity_tokens=4096)
    reps = [SimReplica(i, f"http://r{i}", config, fast=fast) for i in range(3)]
    index = KvIndex()
    feed = KvEventFeed(index, 4, 4)
    feed.watch(reps)
    view = SaltedIndexView(index)
    tokens = list(range(1000, 1040))  # 10 blocks
    keys = chain_block_keys([*tokens, 7, 7, 7, 7], 4)
    engine = reps[1].engine
    assert engine is not None
    urls = [r.url for r in reps]
    assert view.matched_blocks(keys[:10], urls, "v1") == {}
    engine.add_request(EngineRequest("r", 40, 4, keys, "v1"), 0.0)
    engine.advance(1e6)
    # the prompt's 10 blocks (the last output token is never computed: 43 tokens, 10 full blocks)
    assert index.size("http://r1") == 10
    assert view.matched_blocks(keys[:10], urls, "v1") == {"http://r1": 10}
    assert view.matched_blocks(keys[:10], urls, None) == {}  # another namespace
    other = chain_block_keys(tokens[:20] + list(range(5000, 5020)), 4)
    assert view.matched_blocks(other, urls, "v1") == {"http://r1": 5}
    engine.reset_prefix_cache()  # BlockRemoved for every idle cached block
    assert index.size("http://r1") == 0
    engine.add_request(EngineRequest("r2", 40, 4, keys, "v1"), 1e6)
    engine.advance(2e6)
    assert view.matched_blocks(keys[:10], urls, "v1") == {"http://r1": 10}
    reps[1].fail()  # AllBlocksCleared
    assert view.matched_blocks(keys[:10], urls, "v1") == {}
    reps[1].restart()  # the new engine is listened to
    engine = reps[1].engine
    assert engine is not None
    engine.add_request(EngineRequest("r3", 40, 4, keys, None), 0.0)
    engine.advance(1e6)
    assert view.matched_blocks(keys[:10], urls, None) == {"http://r1": 10}
    with pytest.raises(ConfigError):
        KvEventFeed(index, 16, 32)


def test_eviction_reaches_the_index() -> None:
    profile = sorted(PROFILES.values(), key=lambda p: p.name)[0]
    config = ReplicaConfig(profile, block_size=4, kv_capacity_tokens=64)  # 16 blocks
    rep = SimReplica(0, "http://r0", config)
    index = KvIndex()
    KvEventFeed(index, 4, 4).watch([rep])
    engine = rep.engine
    assert engine is not None
    a = chain_block_keys(list(range(48)), 4)
    b = chain_block_keys(list(range(100, 148)), 4)
    engine.add_request(EngineRequest("a", 44, 4, a), 0.0)
    engine.advance(1e6)
    assert SaltedIndexView(index).matched_blocks(a, ["http://r0"]) == {"http://r0": 11}
    engine.add_request(EngineRequest("b", 44, 4, b), 1e6)
    engine.advance(2e6)
    got = SaltedIndexView(index).matched_blocks(a, ["http://r0"])
    assert got.get("http://r0", 0) < 11  # a's blocks were evicted for b's, and the index knows
    assert index.size("http://r0") == len(engine._core.pool.cached_keys(None))


def test_salted_view_reads_keys_lazily_and_equals_salting_them_all() -> None:
    from sessionroute.sim.kvview import _SaltedKeys, salted_keys

    keys = chain_block_keys(list(range(400)), 4)
    lazy = _SaltedKeys(keys, "v3")
    assert len(lazy) == len(keys)
    assert [lazy[i] for i in range(len(keys))] == salted_keys(keys, "v3") == lazy[:]
    assert salted_keys(keys, "v3") != salted_keys(keys, "v4")
