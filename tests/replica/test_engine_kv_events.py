"""The replica model's KV cache events: replaying them gives exactly the engine's cached set."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from sessionroute.replica import EngineRequest, Replica

from .test_engine_fast_equals_reference import Workload, workloads


class Mirror:
    """The cached key set per salt as the events tell it (strict: a store of a key held, or a
    removal of a key not held, fails)."""

    def __init__(self) -> None:
        self.sets: dict[str | None, set[int]] = {}
        self.stored = 0
        self.removed = 0

    def __call__(self, stored: bool, keys: list[int], salt: str | None) -> None:
        held = self.sets.setdefault(salt, set())
        assert keys
        for k in keys:
            if stored:
                assert k not in held, "a cached key was stored again"
                held.add(k)
                self.stored += 1
            else:
                assert k in held, "a key not cached was removed"
                held.remove(k)
                self.removed += 1


def check(rep: Replica, mirror: Mirror) -> None:
    pool = rep._core.pool
    for salt in (None, "s"):
        assert mirror.sets.get(salt, set()) == pool.cached_keys(salt), salt


def drive(w: Workload, fast: bool) -> Mirror:
    rep = Replica(w.config, fast=fast)
    mirror = Mirror()
    rep.set_kv_listener(mirror)
    for at, _, what in w.events:
        while (t := rep.next_event_time()) is not None and t < at:
            rep.advance(t)
            rep._sync()
            check(rep, mirror)
        rep.advance(at)
        if isinstance(what, EngineRequest):
            rep.add_request(what, at)
        else:
            rep.abort(what, at)
    while (t := rep.next_event_time()) is not None:
        rep.advance(t)
    check(rep, mirror)
    rep.reset_prefix_cache()
    check(rep, mirror)
    return mirror


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_events_replay_to_the_cached_set(w: Workload) -> None:
    fast = drive(w, True)
    ref = drive(w, False)
    assert fast.sets == ref.sets
    assert fast.stored == ref.stored


def test_without_a_listener_nothing_is_called_and_events_can_stop() -> None:
    from sessionroute.replica import PROFILES, ReplicaConfig, chain_block_keys

    cfg = ReplicaConfig(next(iter(PROFILES.values())), block_size=4, kv_capacity_tokens=64)
    rep = Replica(cfg)
    mirror = Mirror()
    rep.set_kv_listener(mirror)
    rep.add_request(EngineRequest("a", 12, 2, chain_block_keys(list(range(14)), 4)), 0.0)
    while (t := rep.next_event_time()) is not None:
        rep.advance(t)
    assert mirror.sets[None] == set(chain_block_keys(list(range(14)), 4))
    rep.set_kv_listener(None)
    rep.reset_prefix_cache()
    assert rep._core.pool.cached_keys(None) == set()
    assert mirror.sets[None]  # no longer told
