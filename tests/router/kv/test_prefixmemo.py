"""PrefixMemo gives exactly vLLM's block hashes while hashing only blocks it has not seen."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionroute.errors import ConfigError
from sessionroute.router.kv.hashing import block_hashes
from sessionroute.router.kv.prefixmemo import PrefixMemo, pack_token_ids


def test_a_growing_conversation_hashes_only_its_new_blocks() -> None:
    rng = random.Random(0)
    memo = PrefixMemo(16)
    system = [rng.randrange(50_000) for _ in range(1000)]
    prompt = system + [rng.randrange(50_000) for _ in range(2000)]
    assert memo.hashes(pack_token_ids(prompt)) == block_hashes(prompt, 16)
    assert memo.hashed == len(prompt) // 16
    for _ in range(5):
        before = memo.hashed
        prompt = prompt + [rng.randrange(50_000) for _ in range(rng.randrange(1, 900))]
        assert memo.hashes(pack_token_ids(prompt)) == block_hashes(prompt, 16)
        # only the blocks past the previous prompt's last full block are hashed
        assert memo.hashed - before <= (len(prompt) % 16 + 900) // 16 + 1
    other = system + [rng.randrange(50_000) for _ in range(500)]  # another conversation
    before = memo.hashed
    assert memo.hashes(pack_token_ids(other)) == block_hashes(other, 16)
    assert memo.hashed - before == len(other) // 16 - len(system) // 16
    # salted: a different chain from the first block on
    assert memo.hashes(pack_token_ids(other), "v2") == block_hashes(other, 16, cache_salt="v2")


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 6), st.integers(0, 70), st.sampled_from([None, None, "s"])),
        min_size=1,
        max_size=25,
    ),
    st.integers(1, 40),
)
def test_any_order_of_prompts_gives_vllm_hashes(
    ops: list[tuple[int, int, str | None]], max_blocks: int
) -> None:
    rng = random.Random(len(ops))
    memo = PrefixMemo(4, max_blocks=max_blocks)
    prompts: list[list[int]] = [[]]
    for base, extra, salt in ops:
        start = prompts[base % len(prompts)]
        cut = rng.randrange(len(start) + 1)
        prompt = start[:cut] + [rng.randrange(5) for _ in range(extra)]
        prompts.append(prompt)
        got = memo.hashes(pack_token_ids(prompt), salt)
        assert got == block_hashes(prompt, 4, cache_salt=salt)
        assert memo.size <= max(max_blocks, 0) or memo.size <= len(prompt) // 4


def test_bad_settings() -> None:
    with pytest.raises(ConfigError):
        PrefixMemo(0)
    with pytest.raises(ConfigError):
        PrefixMemo(16, max_blocks=0)
    with pytest.raises(ConfigError):
        PrefixMemo(16, "nope")
