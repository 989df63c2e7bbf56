"""The fast path and the one-step reference give the same results on random small workloads."""

from __future__ import annotations

from dataclasses import dataclass, replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sessionroute.replica import (
    PROFILES,
    EngineRequest,
    Replica,
    ReplicaConfig,
    RequestResult,
    chain_block_keys,
    steps,
)

# the built-in profiles, and one with the per-sequence and per-request terms a calibrated
# profile carries (0 in the built-ins)
_PROFILES = [
    *sorted(PROFILES.values(), key=lambda p: p.name),
    replace(PROFILES["toy-8b-h100-tp1"], name="toy-overheads", b_seq_s=3e-4, b_req_s=2e-3),
]


@dataclass(frozen=True)
class Workload:
    config: ReplicaConfig
    events: list[tuple[float, int, EngineRequest | str]]  # (time, order, request or abort id)
    read_gauges: bool


@st.composite
def workloads(draw: st.DrawFn) -> Workload:
    bs = draw(st.sampled_from([1, 2, 4, 16]))
    nblocks = draw(st.integers(4, 48))
    config = ReplicaConfig(
        draw(st.sampled_from(_PROFILES)),
        block_size=bs,
        kv_capacity_tokens=nblocks * bs,
        max_num_batched_tokens=draw(st.sampled_from([4, 8, 16, 64, 8192])),
        max_num_seqs=draw(st.integers(1, 6)),
        slowdown=draw(st.sampled_from([1.0, 1.7])),
    )
    cap = nblocks * bs
    n = draw(st.integers(1, 10))
    contents: list[list[int]] = []  # prompt + output of earlier requests
    events: list[tuple[float, int, EngineRequest | str]] = []
    for i in range(n):
        prompt: list[int] = []
        kind = draw(st.sampled_from(["fresh", "shared", "next_turn"]))
        if kind == "shared":
            family = draw(st.integers(0, 2))
            prompt = [family * 10_000 + j for j in range(draw(st.integers(0, 3 * bs)))]
        elif kind == "next_turn" and contents:
            prompt = list(draw(st.sampled_from(contents)))
        prompt += [100_000 + i * 1000 + j for j in range(draw(st.integers(1, 2 * bs + 3)))]
        output = [500_000 + i * 1000 + j for j in range(draw(st.integers(1, 30)))]
        if len(prompt) + len(output) > cap:
            continue
        content = prompt + output
        contents.append(content)
        keyed = content if draw(st.booleans()) else prompt
        req = EngineRequest(
            f"r{i}",
            len(prompt),
            len(output),
            chain_block_keys(keyed, bs),
            cache_salt=draw(st.sampled_from([None, None, "s"])),
        )
        at = draw(st.one_of(st.just(0.0), st.floats(0.0, 0.4)))
        events.append((at, 2 * i, req))
        if draw(st.integers(0, 4)) == 0:
            events.append((at + draw(st.floats(0.0, 0.3)), 2 * i + 1, req.request_id))
    events.sort(key=lambda e: (e[0], e[1]))
    return Workload(config, events, draw(st.booleans()))


def drive(w: Workload, fast: bool) -> tuple[dict[str, RequestResult], list[bool], Replica]:
    rep = Replica(w.config, fast=fast)
    results: dict[str, RequestResult] = {}
    aborted: list[bool] = []

    def collect(rs: list[RequestResult]) -> None:
        for r in rs:
            results[r.request_id] = r

    for at, _, what in w.events:
        while (t := rep.next_event_time()) is not None and t < at:
            collect(rep.advance(t))
        collect(rep.advance(at))
        if isinstance(what, EngineRequest):
            rep.add_request(what, at)
        else:
            aborted.append(rep.abort(what, at))
        if w.read_gauges and fast:
            assert 0.0 <= rep.kv_cache_usage <= 1.0
            assert rep.num_running >= 0
    while (t := rep.next_event_time()) is not None:
        collect(rep.advance(t))
    return results, aborted, rep


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_fast_path_equals_reference(w: Workload) -> None:
    fast, fast_aborts, fast_rep = drive(w, True)
    ref, ref_aborts, ref_rep = drive(w, False)
    assert fast_aborts == ref_aborts
    assert sorted(fast) == sorted(ref)
    for rid, r in ref.items():
        f = fast[rid]
        assert abs(f.first_scheduled_s - r.first_scheduled_s) <= 1e-6, rid
        assert abs(f.first_token_s - r.first_token_s) <= 1e-6, rid
        assert abs(f.finish_s - r.finish_s) <= 1e-6, rid
        assert abs(f.itl_max_s - r.itl_max_s) <= 1e-6, rid
        assert abs(f.itl_mean_s - r.itl_mean_s) <= 1e-6, rid
        assert (f.cached_tokens, f.preemptions) == (r.cached_tokens, r.preemptions), rid
    fc, rc = fast_rep.counters(), ref_rep.counters()
    assert abs(fc.busy_time_s - rc.busy_time_s) <= 1e-6
    for name in (
        "prefix_cache_queries",
        "prefix_cache_hits",
        "num_preemptions",
        "prompt_tokens",
        "generation_tokens",
        "iteration_tokens",
        "steps",
        "requests_finished",
    ):
        assert getattr(fc, name) == getattr(rc, name), name
    assert fast_rep.kv_cache_usage == ref_rep.kv_cache_usage == 0.0
    # steps other than prefill runs share empty lists: nothing may have written to them
    assert steps._NO_INTS == [] and steps._NO_FLOATS == []
