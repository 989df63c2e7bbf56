"""Hand-computed scenarios of the replica model (issue 3 acceptance), on both implementations."""

from __future__ import annotations

import pytest

from sessionroute.replica import (
    PROFILES,
    EngineRequest,
    EngineRequestError,
    Replica,
    ReplicaConfig,
    RequestResult,
    chain_block_keys,
)

TOY = PROFILES["toy-8b-h100-tp1"]
BOTH = pytest.mark.parametrize("fast", [True, False], ids=["fast", "reference"])


def req(
    rid: str,
    tokens: list[int],
    output: list[int],
    bs: int = 16,
    salt: str | None = None,
) -> EngineRequest:
    """A request whose keys cover prompt and output blocks."""
    return EngineRequest(
        rid, len(tokens), len(output), chain_block_keys(tokens + output, bs), cache_salt=salt
    )


def drain(rep: Replica) -> list[RequestResult]:
    """Run until idle, the way a simulator drives a replica."""
    out: list[RequestResult] = []
    while (t := rep.next_event_time()) is not None:
        out += rep.advance(t)
    return out


def run_one(rep: Replica, r: EngineRequest, now: float) -> RequestResult:
    rep.add_request(r, now)
    (res,) = drain(rep)
    return res


@BOTH
@pytest.mark.parametrize("n", [1, 15, 16, 17, 32, 100])
def test_fully_cached_prompt_hits_all_but_last_token(fast: bool, n: int) -> None:
    rep = Replica(ReplicaConfig(TOY, block_size=16), fast=fast)
    prompt = list(range(1000, 1000 + n))
    first = run_one(rep, req("a", prompt, [1, 2, 3]), 0.0)
    assert first.cached_tokens == 0
    again = run_one(rep, req("b", prompt, [4, 5]), 1.0)
    assert again.cached_tokens == (n - 1) // 16 * 16
    c = rep.counters()
    assert c.prefix_cache_hits == again.cached_tokens
    assert c.prefix_cache_queries == 2 * n
    assert c.requests_finished == 2


@BOTH
def test_eviction_is_lru_deepest_block_first(fast: bool) -> None:
    # 8 blocks of 16 tokens. A (4 prompt blocks) finishes, then B needs 5 blocks: the 4 never
    # used blocks plus one evicted from A's chain, which must be A's deepest block.
    rep = Replica(ReplicaConfig(TOY, block_size=16, kv_capacity_tokens=128), fast=fast)
    a_prompt = list(range(64))
    run_one(rep, req("a", a_prompt, [7]), 0.0)
    run_one(rep, req("b", list(range(500, 580)), [7]), 1.0)
    again = run_one(rep, req("a2", [*a_prompt, 99], [7]), 2.0)
    assert again.cached_tokens == 48


@BOTH
def test_eviction_takes_least_recently_freed_request_first(fast: bool) -> None:
    # 8 blocks. A then C finish (2 blocks each); D takes 4 fresh + 2 more: A's, not C's.
    rep = Replica(ReplicaConfig(TOY, block_size=16, kv_capacity_tokens=128), fast=fast)
    a, c = list(range(32)), list(range(100, 132))
    run_one(rep, req("a", a, [1]), 0.0)
    run_one(rep, req("c", c, [1]), 1.0)
    run_one(rep, req("d", list(range(200, 296)), [1]), 2.0)
    assert run_one(rep, req("c2", [*c, 5], [1]), 3.0).cached_tokens == 32
    assert run_one(rep, req("a2", [*a, 5], [1]), 4.0).cached_tokens == 0


@BOTH
def test_partial_tail_blocks_are_reused_before_any_cached_block(fast: bool) -> None:
    # vLLM 0.32 BlockPool.free_blocks puts a freed block without a hash (a partial tail) at the
    # front of the free queue. 8 blocks of 16 tokens. A, then B finish, each 2 cached blocks and
    # a partial one; C takes 4 blocks: the 2 never used and A's and B's partial tails, evicting
    # nothing. (Queued at the tail, B's partial block came after A's cached ones, and C evicted
    # A's deepest cached block: A's next turn hit 16 tokens.)
    rep = Replica(ReplicaConfig(TOY, block_size=16, kv_capacity_tokens=128), fast=fast)
    a = list(range(39))
    run_one(rep, req("a", a, [1]), 0.0)
    run_one(rep, req("b", list(range(100, 139)), [1]), 1.0)
    run_one(rep, req("c", list(range(200, 263)), [1]), 2.0)
    assert run_one(rep, req("a2", [*a, 1, 99], [1]), 3.0).cached_tokens == 32


@BOTH
def test_different_cache_salts_never_share(fast: bool) -> None:
    rep = Replica(ReplicaConfig(TOY, block_size=16), fast=fast)
    prompt = list(range(200))
    run_one(rep, req("a", prompt, [1], salt="v1"), 0.0)
    assert run_one(rep, req("b", prompt, [1], salt="v2"), 1.0).cached_tokens == 0
    assert run_one(rep, req("c", prompt, [1]), 2.0).cached_tokens == 0
    assert run_one(rep, req("d", prompt, [1], salt="v1"), 3.0).cached_tokens == 192


@BOTH
def test_output_blocks_are_cached_for_the_next_turn(fast: bool) -> None:
    rep = Replica(ReplicaConfig(TOY, block_size=16), fast=fast)
    prompt, out = list(range(40)), list(range(900, 960))
    run_one(rep, req("t1", prompt, out), 0.0)
    turn2 = [*prompt, *out, *range(3000, 3030)]
    assert run_one(rep, req("t2", turn2, [1]), 5.0).cached_tokens == 96


@BOTH
def test_reset_prefix_cache_drops_idle_blocks(fast: bool) -> None:
    rep = Replica(ReplicaConfig(TOY, block_size=16), fast=fast)
    prompt = list(range(64))
    run_one(rep, req("a", prompt, [1]), 0.0)
    assert rep.reset_prefix_cache() == 4
    assert run_one(rep, req("b", prompt, [1]), 1.0).cached_tokens == 0
    assert rep.kv_cache_usage == 0.0


@BOTH
def test_kv_shortage_preempts_newest_and_readmits_it_first(fast: bool) -> None:
    # 6 blocks; A and B each grow to 4 blocks; max_num_seqs 2 keeps C waiting.
    cfg = ReplicaConfig(TOY, block_size=16, kv_capacity_tokens=96, max_num_seqs=2)
    rep = Replica(cfg, fast=fast)
    rep.add_request(req("A", list(range(16)), list(range(100, 140))), 0.0)
    rep.add_request(req("B", list(range(200, 216)), list(range(300, 340))), 0.0005)
    rep.add_request(req("C", list(range(400, 416)), [1]), 0.0015)
    res = {r.request_id: r for r in drain(rep)}
    assert res["A"].preemptions == 0
    assert res["B"].preemptions >= 1
    assert res["C"].preemptions == 0
    # C fit in the KV cache right after the preemption, yet B went first and held the second
    # seat, so C waited for a finish.
    assert res["C"].first_scheduled_s >= min(res["A"].finish_s, res["B"].finish_s)
    assert rep.counters().num_preemptions == res["B"].preemptions


@BOTH
def test_chunked_prefill_and_step_times(fast: bool) -> None:
    prof = PROFILES["glm45air-h200-tp8"]
    rep = Replica(ReplicaConfig(prof), fast=fast)
    n = 8192 + 100
    res = run_one(rep, EngineRequest("x", n, 3, chain_block_keys(list(range(n)), 16)), 0.0)
    chunk1 = prof.step_time(8192, 0, 0, 8192 * 4096)
    chunk2 = prof.step_time(100, 0, 0, 100 * (8192 + 50))
    assert res.first_scheduled_s == 0.0
    assert res.first_token_s == pytest.approx(chunk1 + chunk2, rel=1e-12)
    d1 = prof.step_time(0, 1, n + 1, 0.0)
    d2 = prof.step_time(0, 1, n + 2, 0.0)
    assert res.finish_s == pytest.approx(chunk1 + chunk2 + d1 + d2, rel=1e-12)
    assert res.itl_max_s == pytest.approx(d2, rel=1e-9)
    assert res.itl_mean_s == pytest.approx((d1 + d2) / 2, rel=1e-9)
    c = rep.counters()
    assert (c.steps, c.iteration_tokens, c.generation_tokens) == (4, n + 2, 3)


@BOTH
def test_head_of_line_blocking_and_max_num_seqs(fast: bool) -> None:
    cfg = ReplicaConfig(TOY, block_size=16, max_num_seqs=1)
    rep = Replica(cfg, fast=fast)
    rep.add_request(req("a", list(range(20)), list(range(50))), 0.0)
    rep.add_request(req("b", list(range(100, 120)), [1]), 0.0)
    res = {r.request_id: r for r in drain(rep)}
    assert res["b"].first_scheduled_s == res["a"].finish_s
    assert res["b"].queue_time_s == res["a"].finish_s


@BOTH
def test_arrival_joins_first_step_starting_at_or_after_now(fast: bool) -> None:
    rep = Replica(ReplicaConfig(TOY), fast=fast)
    rep.add_request(req("a", list(range(20)), list(range(30))), 0.0)
    assert rep.next_event_time() == 0.0  # not advanced yet: the known arrival
    rep.advance(0.0)
    first = rep.next_event_time()
    assert first is not None and first > 0.0
    rep.add_request(req("b", list(range(100, 120)), [1]), first / 2)
    res = {r.request_id: r for r in drain(rep)}
    assert res["b"].first_scheduled_s == pytest.approx(first)


@BOTH
def test_abort_frees_blocks_and_drops_the_result(fast: bool) -> None:
    rep = Replica(ReplicaConfig(TOY), fast=fast)
    rep.add_request(req("a", list(range(20)), list(range(200))), 0.0)
    rep.add_request(req("b", list(range(100, 120)), list(range(10))), 0.0)
    rep.advance(0.05)
    assert rep.num_running == 2
    assert rep.abort("a", 0.05)
    assert not rep.abort("a", 0.05)
    assert not rep.abort("nope", 0.05)
    res = drain(rep)
    assert [r.request_id for r in res] == ["b"]
    assert rep.kv_cache_usage == 0.0
    assert rep.num_running == 0 and rep.num_waiting == 0


def test_bad_requests_raise_named_errors() -> None:
    rep = Replica(ReplicaConfig(TOY, block_size=16, kv_capacity_tokens=160))
    with pytest.raises(EngineRequestError, match="prompt_len"):
        rep.add_request(EngineRequest("a", 0, 1, []), 0.0)
    with pytest.raises(EngineRequestError, match="output_len"):
        rep.add_request(EngineRequest("a", 1, 0, []), 0.0)
    with pytest.raises(EngineRequestError, match="max_model_len"):
        rep.add_request(EngineRequest("a", 32768, 1, [0] * 2048), 0.0)
    with pytest.raises(EngineRequestError, match="KV capacity"):
        rep.add_request(EngineRequest("a", 160, 1, list(range(10))), 0.0)
    with pytest.raises(EngineRequestError, match="block_keys"):
        rep.add_request(EngineRequest("a", 32, 1, [1]), 0.0)
    rep.add_request(EngineRequest("a", 3, 1, []), 0.0)
    with pytest.raises(EngineRequestError, match="duplicate"):
        rep.add_request(EngineRequest("a", 3, 1, []), 0.0)


def test_chain_block_keys_chain_and_drop_partial_block() -> None:
    k1 = chain_block_keys([1, 2, 3, 4, 5], 2)
    k2 = chain_block_keys([1, 2, 9, 4], 2)
    assert len(k1) == 2 and len(k2) == 2
    assert k1[0] == k2[0] and k1[1] != k2[1]
    assert chain_block_keys([3, 4], 2) != [k1[1]]


def test_idle_replica_has_no_event_and_slowdown_scales_steps() -> None:
    base = Replica(ReplicaConfig(TOY))
    slow = Replica(ReplicaConfig(TOY, slowdown=2.0))
    assert base.next_event_time() is None
    r1 = run_one(base, req("a", list(range(40)), list(range(20))), 0.0)
    r2 = run_one(slow, req("a", list(range(40)), list(range(20))), 0.0)
    assert r2.finish_s == pytest.approx(2 * r1.finish_s, rel=1e-12)
