"""The ideal prefix cache (the hit-rate bound of an arm): hits, salts, and its galloping search
against a linear scan."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionroute.replica.ideal import IdealCache


def test_ideal_cache_hits_a_prefix_seen_before_at_most_prompt_minus_one() -> None:
    cache = IdealCache(block_size=4)
    assert cache.observe([1, 2, 3], 12, 4, None) == 0
    assert cache.observe([1, 2, 3, 4], 16, 4, None) == 12  # blocks 1-3 seen (and 4: output)
    assert cache.observe([1, 2, 3, 4], 16, 4, "other salt") == 0
    assert cache.observe([1, 2, 3, 4], 16, 4, None) == 15  # all seen: prompt_len - 1
    assert cache.hit_rate == pytest.approx((12 + 15) / (12 + 16 * 3))


def _linear_hit(seen: set[int], keys: list[int], prompt_len: int, bs: int) -> int:
    n = 0
    for k in keys[: prompt_len // bs]:
        if k not in seen:
            break
        n += 1
    return min(n * bs, prompt_len - 1)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(1, 40), st.integers(1, 300), st.integers(1, 50)),
        min_size=1,
        max_size=30,
    )
)
def test_ideal_cache_galloping_search_equals_a_linear_scan(
    turns: list[tuple[int, int, int, int]],
) -> None:
    bs = 8
    cache = IdealCache(bs)
    seen: set[int] = set()
    for branch, depth, plen, olen in turns:
        # chained keys: a branch's keys are a prefix of a longer branch's keys
        keys = [branch * 10_000 + min(i, depth) * 100 + i for i in range((plen + olen) // bs)]
        expected = _linear_hit(seen, keys, plen, bs)
        assert cache.observe(keys, plen, olen, None) == expected
        seen.update(keys[: (plen + olen) // bs])
