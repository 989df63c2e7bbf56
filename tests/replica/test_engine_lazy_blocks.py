"""Block-lazy decoders of the fast path: the KV pool's state equals the reference's at every
event, not only the request results.

Decoders whose block work is kept lazily (``DecoderBlocks.blocks_lazy_ok``) must show exactly the
reference's blocks once brought up to date: after every arrival and abort, and at the end, both
replicas must agree on free blocks, the cached keys of every salt, the LRU free queue in
eviction order and each running request's blocks. (Arrival and abort times are drawn floats,
never exactly a step end, where the fast path may still hold a step the reference applied.)
Workloads stress what can read a lazy decoder's blocks: next turns and shared prefixes arriving
while the earlier request still decodes (lookups and registrations reaching its segment),
duplicate outputs, small pools (evictions, preemptions).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sessionroute.replica import PROFILES, EngineRequest, Replica, ReplicaConfig, chain_block_keys
from sessionroute.replica.blocks import BlockPool
from sessionroute.replica.core import Core
from sessionroute.replica.fast import FastCore
from sessionroute.replica.segments import SegmentPool

from .pool_views import block_queue, segment_queue


@dataclass(frozen=True)
class Workload:
    config: ReplicaConfig
    events: list[tuple[float, int, EngineRequest | str]]  # (time, order, request or abort id)


@st.composite
def workloads(draw: st.DrawFn) -> Workload:
    bs = draw(st.sampled_from([1, 2, 4]))
    nblocks = draw(st.integers(8, 64))
    config = ReplicaConfig(
        PROFILES["toy-8b-h100-tp1"],
        block_size=bs,
        kv_capacity_tokens=nblocks * bs,
        max_num_batched_tokens=draw(st.sampled_from([8, 16, 64])),
        max_num_seqs=draw(st.integers(2, 8)),
    )
    cap = nblocks * bs
    contents: list[list[int]] = []
    events: list[tuple[float, int, EngineRequest | str]] = []
    for i in range(draw(st.integers(2, 10))):
        kind = draw(st.sampled_from(["fresh", "shared", "next_turn", "duplicate"]))
        if kind == "duplicate" and contents:
            content = list(draw(st.sampled_from(contents)))  # same prompt and output
            cut = draw(st.integers(1, len(content) - 1)) if len(content) > 1 else 1
            prompt, output = content[:cut], content[cut:] or [7]
        else:
            prompt = []
            if kind == "shared":
                prompt = [draw(st.integers(0, 1)) * 10_000 + j for j in range(3 * bs)]
            elif kind == "next_turn" and contents:
                prompt = list(draw(st.sampled_from(contents)))
            prompt += [100_000 + i * 1000 + j for j in range(draw(st.integers(1, 2 * bs + 3)))]
            output = [500_000 + i * 1000 + j for j in range(draw(st.integers(1, 40)))]
        if len(prompt) + len(output) > cap:
            continue
        contents.append(prompt + output)
        req = EngineRequest(
            f"r{i}",
            len(prompt),
            len(output),
            chain_block_keys(prompt + output, bs),
            cache_salt=draw(st.sampled_from([None, None, "s"])),
        )
        at = draw(st.floats(0.0, 0.3))
        events.append((at, 2 * i, req))
        if draw(st.integers(0, 5)) == 0:
            events.append((at + draw(st.floats(0.0, 0.2)), 2 * i + 1, req.request_id))
    events.sort(key=lambda e: (e[0], e[1]))
    return Workload(config, events)


def _state(rep: Replica) -> tuple[object, ...]:
    """Pool state and running requests' blocks, the fast path's block-lazy decoders synced."""
    _ = rep.kv_cache_usage  # makes the fast path's state exact at the replica's time
    core: Core = rep._core
    pool = core.pool
    if isinstance(core, FastCore):
        core.sync_all_blocks()
        if not isinstance(pool, SegmentPool):
            raise AssertionError("fast path without a SegmentPool")
        queue = segment_queue(pool)
        pool.audit()
    else:
        if not isinstance(pool, BlockPool):
            raise AssertionError("reference without a BlockPool")
        queue = block_queue(pool)
    running = sorted((r.rid, r.nblocks, r.nreg) for r in core.running)
    return (
        pool.num_free,
        pool.cached_keys(None),
        pool.cached_keys("s"),
        queue,
        running,
        len(core.done),
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_pool_state_equals_reference_at_every_event(w: Workload) -> None:
    reps = [Replica(w.config, fast=True), Replica(w.config, fast=False)]
    for at, _, what in w.events:
        for rep in reps:
            while (t := rep.next_event_time()) is not None and t < at:
                rep.advance(t)
            rep.advance(at)
        fast, ref = (_state(rep) for rep in reps)
        assert fast == ref
        for rep in reps:
            if isinstance(what, EngineRequest):
                rep.add_request(what, at)
            else:
                rep.abort(what, at)
    for rep in reps:
        while (t := rep.next_event_time()) is not None:
            rep.advance(t)
    assert _state(reps[0]) == _state(reps[1])


def test_lookup_into_a_block_lazy_decoders_segment_brings_it_up_to_date() -> None:
    """A request whose prompt continues a decoding request's content hits the decoder's blocks
    (including those it filled lazily), and the decoder goes back to per-step block work."""
    bs = 4
    config = ReplicaConfig(
        PROFILES["toy-8b-h100-tp1"],
        block_size=bs,
        kv_capacity_tokens=400 * bs,
        max_num_batched_tokens=64,
        max_num_seqs=4,
    )
    content = list(range(1000, 1000 + 40 + 200))
    first = EngineRequest("a", 40, 200, chain_block_keys(content, bs))
    reps = [Replica(config, fast=True), Replica(config, fast=False)]
    for rep in reps:
        rep.add_request(first, 0.0)
        rep.advance(0.5)  # "a" decodes for a while
        assert rep.num_running == 1  # (a gauge read splits the decode run at 0.5 s)
    fast_core = reps[0]._core
    assert isinstance(fast_core, FastCore)
    a = fast_core.reqs["a"]
    assert a.lazy and a.blazy
    done_tokens = a.num_output + fast_core.g - a.sync
    assert done_tokens > 3 * bs  # it has filled blocks lazily since it became a decoder
    follow = EngineRequest(
        "b", 40 + done_tokens - 2, 8, chain_block_keys(content[: 40 + done_tokens + 6], bs)
    )
    for rep in reps:
        rep.add_request(follow, 0.5)
    b = fast_core.reqs["b"]
    while b not in fast_core.running:
        t = reps[0].next_event_time()
        assert t is not None
        reps[0].advance(t)
    assert a in fast_core.running and a.lazy and not a.blazy  # the lookup touched it
    results = []
    for rep in reps:
        out = {}
        while (t := rep.next_event_time()) is not None:
            out.update({r.request_id: r for r in rep.advance(t)})
        results.append(out)
    fast, ref = results
    assert fast["b"].cached_tokens == ref["b"].cached_tokens > 40
    for rid in ("a", "b"):
        assert fast[rid].finish_s == pytest.approx(ref[rid].finish_s, abs=1e-6)
    assert _state(reps[0]) == _state(reps[1])
