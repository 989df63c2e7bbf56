"""Prefill runs of the fast path: driving the replica at a finish inside a run (abort, slowdown
or gauge read right there) gives the reference's results."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace

import pytest

from sessionroute.replica import (
    PROFILES,
    EngineRequest,
    Replica,
    ReplicaConfig,
    RequestResult,
    chain_block_keys,
)
from sessionroute.replica.fast import FastCore


def _config() -> ReplicaConfig:
    return ReplicaConfig(
        PROFILES["toy-8b-h100-tp1"],
        block_size=4,
        kv_capacity_tokens=4096,
        max_num_batched_tokens=32,
        max_num_seqs=8,
    )


def _req(rid: str, base: int, prompt: int, output: int) -> EngineRequest:
    tokens = list(range(base, base + prompt + output))
    return EngineRequest(rid, prompt, output, chain_block_keys(tokens, 4))


def _drive(fast: bool, action: Callable[[Replica, float], None]) -> list[tuple[object, ...]]:
    """Decoders finish one by one while a long prompt prefills; ``action`` runs at the first
    finish that happens while the long prompt is still in prefill."""
    rep = Replica(_config(), fast=fast)
    for i in range(5):
        rep.add_request(_req(f"d{i}", 10_000 * (i + 1), 6, 12 + 3 * i), 0.0)
    rep.add_request(_req("long", 900_000, 600, 4), 0.0)
    done: list[RequestResult] = []
    acted = False
    while True:
        t = rep.next_event_time()
        if t is None:
            break
        out = rep.advance(t)
        done += out
        if out and not acted and all(r.request_id != "long" for r in done):
            action(rep, t)
            acted = True
    if not acted:
        raise AssertionError("no finish happened during the long prefill")
    c = rep.counters()
    rows: list[tuple[object, ...]] = [
        (r.request_id, r.first_scheduled_s, r.first_token_s, r.finish_s, r.cached_tokens)
        for r in done
    ]
    rows.append((c.steps, c.generation_tokens, c.iteration_tokens, c.busy_time_s))
    return rows


def _abort_long(rep: Replica, t: float) -> None:
    if not rep.abort("long", t):
        raise AssertionError("long was not live")


def _abort_decoder(rep: Replica, t: float) -> None:
    rep.abort("d4", t)


def _slow_down(rep: Replica, t: float) -> None:
    rep.set_slowdown(1.7, t)


def _read_gauges(rep: Replica, t: float) -> None:
    _ = (rep.num_running, rep.num_waiting, rep.kv_cache_usage)


@pytest.mark.parametrize("action", [_abort_long, _abort_decoder, _slow_down, _read_gauges])
def test_acting_at_a_finish_inside_a_prefill_run_matches_reference(
    action: Callable[[Replica, float], None],
) -> None:
    fast = _drive(True, action)
    ref = _drive(False, action)
    assert len(fast) == len(ref)
    for a, b in zip(fast, ref, strict=True):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            if isinstance(x, float) and isinstance(y, float):
                assert x == pytest.approx(y, abs=1e-6)
            else:
                assert x == y


@pytest.mark.parametrize("slowdown", [1.0, 1.7, 0.3])
@pytest.mark.parametrize("context", [40, 3001, 17_017])
def test_prefill_run_step_times_are_step_time_bit_for_bit(slowdown: float, context: int) -> None:
    """A planned prefill run's durations are exactly ``StepTimeProfile.step_time`` (the plan
    computes the roofline part once per run and adds the context terms itself)."""
    profile = PROFILES["glm45air-h200-tp8"]
    rep = Replica(ReplicaConfig(profile, block_size=16, slowdown=slowdown))
    for i in range(3):  # decoders that outlive the run
        rep.add_request(_req(f"d{i}", 100_000 * (i + 1), context + i, 2000), 0.0)
    rep.advance(1.0)  # inside their decode run (12.5 s)
    rep.add_request(_req("long", 900_000, 120_000, 4), 1.0)
    core = rep._core
    assert isinstance(core, FastCore)
    for _ in range(20):
        t = rep.next_event_time()
        assert t is not None
        st = core.current_step()
        if st is not None and st.pre:
            break
        rep.advance(t)
    assert st is not None and st.pre and st.req is not None and st.j == 0 and st.k >= 2
    d = core.decoders.n_dec
    nc = st.req.nc
    for j, chunk in enumerate(st.chunks):
        assert chunk == core.budget - d
        c = core.decoders.s0 + d * (core.g + j)
        want = profile.step_time(chunk, d, c, chunk * (nc + chunk / 2)) * slowdown
        assert st.dts[j] == want
        nc += chunk


def _pressure_workload(seed: int) -> tuple[ReplicaConfig, list[tuple[float, EngineRequest]]]:
    """A small replica under KV pressure: follow-up turns of earlier requests, long prompts in
    chunks of a small token budget beside decoders that finish with partial tail blocks."""
    rng = random.Random(seed)
    bs = rng.choice([2, 4, 16])
    nb = rng.randint(6, 40)
    config = ReplicaConfig(
        replace(PROFILES["toy-8b-h100-tp1"], name="toy-overheads", b_seq_s=3e-4, b_req_s=2e-3),
        block_size=bs,
        kv_capacity_tokens=nb * bs,
        max_num_batched_tokens=rng.choice([4, 8, 16, 64]),
        max_num_seqs=rng.randint(2, 8),
    )
    reqs: list[tuple[float, EngineRequest]] = []
    contents: list[list[int]] = []
    t = 0.0
    for i in range(rng.randint(3, 25)):
        prompt = list(rng.choice(contents)) if contents and rng.random() < 0.5 else []
        prompt += [10**6 + i * 1000 + j for j in range(rng.randint(1, 3 * bs + 5))]
        prompt = prompt[: max(1, nb * bs // 2)]
        output = [2 * 10**6 + i * 1000 + j for j in range(rng.randint(1, 30))]
        output = output[: max(1, nb * bs - len(prompt))]
        contents.append(prompt + output)
        t += rng.expovariate(100.0)
        keys = chain_block_keys(prompt + output, bs)
        reqs.append((t, EngineRequest(str(i), len(prompt), len(output), keys)))
    return config, reqs


@pytest.mark.parametrize("seed", [544, 561])
def test_partial_tails_freed_inside_a_prefill_run_match_reference(seed: int) -> None:
    # A decoder finishing inside a prefill run frees its partial tail block to the front of the
    # free blocks: the run's allocations up to that finish must not take it (they evicted
    # queued blocks instead); found by comparing the two paths on random pressure workloads
    config, reqs = _pressure_workload(seed)
    results: list[list[RequestResult]] = []
    for fast in (True, False):
        rep = Replica(config, fast=fast)
        done: list[RequestResult] = []
        for at, r in reqs:
            done += rep.advance(at)
            rep.add_request(r, at)
        done += rep.advance(float("inf"))
        results.append(sorted(done, key=lambda r: r.request_id))
    fast_path, reference = results
    assert [(r.request_id, r.cached_tokens, r.preemptions) for r in fast_path] == [
        (r.request_id, r.cached_tokens, r.preemptions) for r in reference
    ]
    assert [r.finish_s for r in fast_path] == pytest.approx([r.finish_s for r in reference])
