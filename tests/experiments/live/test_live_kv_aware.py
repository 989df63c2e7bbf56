"""``compare --live`` with a ``kv_aware`` arm: emulated replicas publish their KV cache events
over ZMQ in vLLM's format, the arm's router (``serve``) binds a subscriber per replica and
hashes each request with the emulator's tokenizer; no request carries a session id."""

from __future__ import annotations

from typing import Any

import pytest

from sessionroute.errors import ConfigError
from sessionroute.experiments.live.runner import LiveArmRunner, run_live_experiment
from sessionroute.experiments.spec import parse_experiment

NO_IDS = {"router": {"send_session_header": False}}


def experiment(mode: str = "in-process") -> dict[str, Any]:
    return {
        "name": "live-kv-aware",
        "workload": {
            "kind": "toy",
            "options": {
                "sessions": 8, "arrival_rate_per_s": 4.0, "turns_p50": 4, "turns_p90": 5,
                "turns_max": 5, "system_prompt_tokens": 64, "first_p50": 600,
                "first_p90": 900, "output_p50": 24, "output_p90": 48, "followup_p50": 100,
                "followup_p90": 200, "think_p50_s": 0.5, "think_p90_s": 1.0,
            },
        },
        "replicas": {"count": 3},
        "live": {"time_scale": 10, "router": "sessionroute-inprocess", "emulate_mode": mode},
        "arms": [
            {"name": "kv_aware (no ids)", "policy": "kv_aware", "overrides": NO_IDS},
            {"name": "round_robin (no ids)", "policy": "round_robin", "overrides": NO_IDS},
        ],
        "allow_differences": ["router.send_session_header"],
    }  # fmt: skip


@pytest.mark.parametrize("mode", ["in-process", "process"])
def test_kv_aware_live_beats_round_robin_without_session_ids(mode: str) -> None:
    out = run_live_experiment(parse_experiment(experiment(mode), env={}))
    kv, rr = (r.metrics for r in out.results)
    for m in (kv, rr):
        assert m["requests_failed"] == 0, m["errors"]
        assert m["sessions_completed"] == 8
        # neither policy keeps a session table: the sessions the workload ran, as the
        # simulator counts them (the routers saw no session ids)
        assert m["sessions_new"] == 8
    # kv_aware brings each conversation's turns back to the replica holding it: later turns
    # hit; round_robin spreads them over 3 replicas (about one in three lands on its cache).
    # The simulator predicts 0.72 vs 0.43; live, a turn that arrives before its previous turn's
    # BlockStored event was applied is routed without it (0.61-0.70 vs 0.34-0.39 measured with
    # both cores busy), so the margin asserted here is 0.1 (equal routing would give ~0). Events
    # published before a replica's PUB socket connected are fetched from its replay socket; when
    # the router misread the replay replies, they were lost and a CI run measured 0.45 vs 0.41.
    assert kv["prefix_cache_hit_rate"] >= rr["prefix_cache_hit_rate"] + 0.1, (
        kv["prefix_cache_hit_rate"],
        rr["prefix_cache_hit_rate"],
    )


def test_kv_aware_needs_emulated_replicas() -> None:
    doc = experiment()
    doc["live"] = {"replicas": "urls", "urls": ["http://127.0.0.1:9"]}
    with pytest.raises(ConfigError, match="emulated replicas"):
        LiveArmRunner(parse_experiment(doc, env={}))
