"""The simulator's view of the replicas' prefix caches (what kv_aware sees in simulation)."""

from __future__ import annotations

import pytest

from sessionroute.errors import ConfigError
from sessionroute.replica import EngineRequest, ReplicaConfig
from sessionroute.replica.api import chain_block_keys
from sessionroute.replica.profiles import PROFILES
from sessionroute.sim.kvview import ReplicaCacheView
from sessionroute.sim.replicas import SimReplica


@pytest.mark.parametrize("fast", [True, False])
def test_view_reports_the_cached_prefix_per_replica_and_salt(fast: bool) -> None:
    profile = sorted(PROFILES.values(), key=lambda p: p.name)[0]
    config = ReplicaConfig(profile, block_size=4, kv_capacity_tokens=4096)
    reps = [SimReplica(i, f"http://r{i}", config, fast=fast) for i in range(3)]
    tokens = list(range(1000, 1040))  # 10 blocks
    keys = chain_block_keys([*tokens, 7, 7, 7, 7], 4)
    engine = reps[1].engine
    assert engine is not None
    engine.add_request(EngineRequest("r", 40, 4, keys, "v1"), 0.0)
    engine.advance(1e6)
    view = ReplicaCacheView(reps, 4, 4)
    urls = [r.url for r in reps]
    assert view.matched_blocks(keys[:10], urls, "v1") == {"http://r1": 10}
    assert view.matched_blocks(keys[:10], urls, None) == {}  # another namespace
    other = chain_block_keys(tokens[:20] + list(range(5000, 5020)), 4)
    assert view.matched_blocks(other, urls, "v1") == {"http://r1": 5}
    reps[1].fail()
    assert view.matched_blocks(keys[:10], urls, "v1") == {}
    with pytest.raises(ConfigError):
        ReplicaCacheView(reps, 16, 32)
