"""``bench policies --prompt-tokens`` measures kv_aware as the live router runs it: growing
conversations without session ids, only each turn's new blocks hashed."""

from __future__ import annotations

from sessionroute.bench.policies import bench_long_prompts


def test_kv_aware_rows_hash_only_new_blocks_and_report_the_cold_turn() -> None:
    row = bench_long_prompts("kv_aware", workers=8, sessions=6, turns=40, prompt_tokens=8192)
    blocks = 8192 // 16
    assert row["policy"] == "kv_aware" and row["workers"] == 8
    # a turn adds a reply and an observation (hundreds to thousands of tokens), never the
    # whole prompt: the memo reuses the conversation's earlier blocks
    assert 0 < row["new_blocks_p50"] < blocks / 4
    assert row["mean_prompt_tokens"] > 8192
    assert row["hash_p50_us"] <= row["p50_us"]
    assert row["cold_ms"] > 0 and row["vllm_hash_ms"] > 0 and row["pack_us"] > 0


def test_other_policies_keep_the_key_only_long_prompt_mode() -> None:
    row = bench_long_prompts("consistent_hash", workers=8, sessions=6, turns=20, prompt_tokens=4096)
    assert "hash_p50_us" not in row and row["prompt_tokens"] == 4096
