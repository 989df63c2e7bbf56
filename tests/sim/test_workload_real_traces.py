"""The public traces shipped with the package (gzip files): load, re-key, replay a slice."""

from __future__ import annotations

from pathlib import Path

from sessionroute.clock import ManualClock
from sessionroute.sim import SimSpec, run_simulation
from sessionroute.workloads.mooncake import load_mooncake, load_mooncake_sessions
from sessionroute.workloads.traces import (
    MOONCAKE_CONVERSATION,
    MOONCAKE_CONVERSATION_SESSIONS,
    WEKA_REQUESTS,
    resolve_trace,
)
from sessionroute.workloads.weka import WekaKeys, load_weka


def _trace(name: str) -> Path:
    """The trace as every user gets it: found by name, whatever ``SESSIONROUTE_TRACES`` says."""
    return resolve_trace(name, env={})


def test_weka_loads_whole_and_its_prefix_tree_is_rebuilt_exactly() -> None:
    trace = load_weka(_trace(WEKA_REQUESTS))
    assert len(trace.rows) == 49334
    assert len(trace.sessions) == 710
    keys = WekaKeys(trace, 64)
    checked = 0
    for sess in sorted(trace.sessions)[:25]:
        built = {i: list(keys.keys(i)) for i in trace.sessions[sess]}
        for i, k in built.items():
            r = trace.rows[i]
            assert len(k) == r.input_tokens // 64
            if r.match_row < 0:
                continue
            parent = built[r.match_row]
            c = r.cached_tokens // 64  # the longest common prefix, in 64-token blocks
            assert k[:c] == parent[:c]
            if c < min(len(k), len(parent)):
                assert k[c] != parent[c]
            checked += 1
    assert checked > 500


def test_mooncake_conversation_loads_with_its_sessions() -> None:
    trace = load_mooncake(_trace(MOONCAKE_CONVERSATION))
    sessions = load_mooncake_sessions(_trace(MOONCAKE_CONVERSATION_SESSIONS), len(trace.requests))
    assert len(trace.requests) == 12031
    assert len(set(sessions)) == 8056


def test_a_weka_slice_replays_every_session_with_prefix_hits() -> None:
    spec = SimSpec.model_validate(
        {
            "workload": {
                "kind": "trace:weka",
                "options": {"max_sessions": 6, "concurrency": 3, "max_think_s": 5.0},
            },
            "replicas": {"block_size": 256, "max_model_len": 1_000_000},
        }
    )
    m = run_simulation(spec, "sticky_least_loaded", seed=1, wall_clock=ManualClock()).metrics
    w = m["workload"]
    assert w["sessions_started"] == 6
    assert m["sessions_completed"] == 6
    assert m["requests_completed"] == w["requests_sent"] > 0
    assert m["prefix_cache_hit_rate"] > 0.8
    assert m["ideal_hit_rate"] >= m["prefix_cache_hit_rate"] - 1e-9


def test_a_mooncake_slice_replays_open_loop() -> None:
    spec = SimSpec.model_validate(
        {
            "workload": {"kind": "trace:mooncake", "options": {"max_requests": 300}},
            "replicas": {"block_size": 256},
        }
    )
    m = run_simulation(spec, "consistent_hash", seed=1, wall_clock=ManualClock()).metrics
    assert m["requests_completed"] == 300
    assert m["sessions_completed"] == m["workload"]["sessions_total"]
    assert 0 < m["prefix_cache_hit_rate"] <= m["ideal_hit_rate"] + 1e-9
