"""``sticky_until_saturated`` (llm-d): affinity filter, exploration, TTFT gate, least prefill."""

from __future__ import annotations

from typing import Any

import pytest

from sessionroute.errors import ConfigError
from sessionroute.router.policies import create_policy
from sessionroute.router.policies.sticky_until_saturated import StickyUntilSaturatedPolicy

from .conftest import A, B, make_core, req

NO_EXPLORE: dict[str, Any] = {"explore_fraction": 0.0}


def _policy(core: Any) -> StickyUntilSaturatedPolicy:
    assert isinstance(core.policy, StickyUntilSaturatedPolicy)
    return core.policy


@pytest.mark.parametrize(("threshold", "second"), [(0.80, A), (0.90, B)])
def test_affinity_threshold_keeps_only_workers_holding_enough_of_the_prompt(
    threshold: float, second: str
) -> None:
    """10 of 12 blocks (0.83) cached on A: kept at threshold 0.80, not at 0.90, where the
    worker with fewer uncached prefill tokens in flight (B, none) wins."""
    core = make_core("sticky_until_saturated", {**NO_EXPLORE, "affinity_threshold": threshold})
    first = core.route(req(range(10)))
    assert first.worker == A  # both idle: the first never-chosen worker
    second_res = core.route(req(range(12)))
    assert second_res.worker == second
    sticky = 1 if second == A else 0
    assert _policy(core).decisions == {
        "sticky": sticky,
        "explore": 0,
        "no_affinity": 2 - sticky,
        "saturated": 0,
    }


@pytest.mark.parametrize(("n_blocks", "second"), [(10, A), (11, B)])
def test_affinity_threshold_is_inclusive(n_blocks: int, second: str) -> None:
    """8 cached blocks of 10 is exactly 0.80 (kept); 8 of 11 (0.73) is not."""
    core = make_core("sticky_until_saturated", NO_EXPLORE)
    assert core.route(req(range(8))).worker == A
    assert core.route(req(range(n_blocks))).worker == second


def test_without_affinity_the_fewest_uncached_prefill_tokens_win() -> None:
    core = make_core("sticky_until_saturated", NO_EXPLORE)
    big = core.route(req(range(100, 110), tokens=5000))  # A: 5000 uncached in flight
    small = core.route(req(range(200, 210), tokens=100))  # B: 100
    assert (big.worker, small.worker) == (A, B)
    assert [_policy(core).prefill[w] for w in (A, B)] == [5000, 100]
    assert core.route(req(range(300, 310), tokens=10)).worker == B  # 100 < 5000
    core.complete(big)  # A's prefill done
    assert _policy(core).prefill[A] == 0
    assert core.route(req(range(400, 410), tokens=10)).worker == A


@pytest.mark.parametrize(
    ("margin", "expected", "path"), [(18.0, B, "saturated"), (60.0, A, "sticky")]
)
def test_ttft_gate_breaks_stickiness_when_the_sticky_worker_is_slower_by_the_margin(
    margin: float, expected: str, path: str
) -> None:
    """A holds the prefix but 5,000 uncached tokens wait there: estimated TTFT on A is
    (5000 + 20) / 100 = 50.2 s against 120 / 100 = 1.2 s on B; the 49 s gap breaks an 18 s
    margin, not a 60 s one."""
    opts = {**NO_EXPLORE, "prefill_tokens_per_s": 100.0, "ttft_margin_s": margin}
    core = make_core("sticky_until_saturated", opts)
    assert core.route(req(range(10), tokens=5000)).worker == A
    got = core.route(req(range(12), tokens=120))
    assert got.worker == expected
    assert _policy(core).decisions[path] == 1


@pytest.mark.parametrize(
    ("rate", "expected", "path"), [(100.0, B, "saturated"), (1000.0, A, "sticky")]
)
def test_prefill_rate_scales_the_ttft_estimate(rate: float, expected: str, path: str) -> None:
    """The same 4,900-token gap in queued uncached prefill is 49 s at 100 tok/s (over the
    18 s margin) and 4.9 s at 1,000 tok/s (under it)."""
    opts = {**NO_EXPLORE, "prefill_tokens_per_s": rate}
    core = make_core("sticky_until_saturated", opts)
    assert core.route(req(range(10), tokens=5000)).worker == A
    assert core.route(req(range(12), tokens=120)).worker == expected
    assert _policy(core).decisions[path] == 1


@pytest.mark.parametrize(("fraction", "expected"), [(0.0, A), (1.0, B)])
def test_exploration_skips_the_affinity_filter(fraction: float, expected: str) -> None:
    core = make_core("sticky_until_saturated", {"explore_fraction": fraction})
    assert core.route(req(range(10))).worker == A
    assert core.route(req(range(10))).worker == expected  # B has no prefill in flight


def test_one_percent_of_requests_explore_by_default() -> None:
    core = make_core("sticky_until_saturated", seed=7)
    for i in range(4000):
        core.complete(core.route(req([i % 50, 1000 + i % 50])))
    explored = _policy(core).decisions["explore"]
    assert 20 <= explored <= 60  # 1 % of 4,000 = 40


@pytest.mark.parametrize(
    "bad",
    [
        {"affinity_threshold": 1.5},
        {"explore_fraction": -0.1},
        {"ttft_margin_s": -1.0},
        {"prefill_tokens_per_s": 0.0},
        {"max_tree_blocks": 0},
    ],
)
def test_bad_options_are_named(bad: dict[str, Any]) -> None:
    from sessionroute.clock import ManualClock

    with pytest.raises(ConfigError, match=next(iter(bad))):
        create_policy("sticky_until_saturated", bad, clock=ManualClock())
