"""The one retry decision: schedule, jitter, giving up, and re-placing an unavailable worker."""

from __future__ import annotations

import random

import pytest

from sessionroute.router import RouterConfig
from sessionroute.router.retry import RetryPolicy


def test_backoff_grows_by_the_multiplier_up_to_the_cap_without_jitter() -> None:
    config = RouterConfig(
        retry_backoff_s=0.05, retry_backoff_multiplier=1.5, retry_max_backoff_s=0.1,
        retry_jitter_factor=0.0,
    )  # fmt: skip
    policy = RetryPolicy(config, random.Random(0))
    assert [policy.backoff_s(k) for k in (1, 2, 3, 4)] == pytest.approx([0.05, 0.075, 0.1, 0.1])


def test_jitter_stays_within_its_factor_and_comes_from_the_injected_generator() -> None:
    config = RouterConfig(retry_backoff_s=1.0, retry_jitter_factor=0.2)
    a = [RetryPolicy(config, random.Random(7)).backoff_s(1) for _ in range(3)]
    assert len(set(a)) == 1  # same seed, same draw
    waits = [RetryPolicy(config, random.Random(s)).backoff_s(1) for s in range(200)]
    assert all(0.8 <= w <= 1.2 for w in waits) and max(waits) - min(waits) > 0.3


def test_after_failure_waits_for_an_available_worker_and_re_places_at_once_otherwise() -> None:
    config = RouterConfig(retry_max_attempts=3, retry_jitter_factor=0.0)
    policy = RetryPolicy(config, random.Random(0))
    assert policy.after_failure(1, worker_available=True) == pytest.approx(0.05)
    assert policy.after_failure(2, worker_available=False) == 0.0  # placed again at once
    assert policy.after_failure(3, worker_available=True) is None  # three attempts made
    one = RetryPolicy(RouterConfig(retry_max_attempts=1), random.Random(0))
    assert one.after_failure(1, worker_available=False) is None  # retries disabled


def test_retryable_statuses_are_vllm_routers() -> None:
    assert [s for s in range(400, 600) if RetryPolicy.retryable(s)] == [
        408, 429, 500, 502, 503, 504,
    ]  # fmt: skip
