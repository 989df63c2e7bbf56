"""Quantile-specified distributions reproduce their quantiles."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sessionroute.errors import ConfigError
from sessionroute.workloads.distributions import LogNormal, QuantileTable


def test_lognormal_hits_its_median_and_p90_and_respects_the_cap() -> None:
    d = LogNormal(250, 1000, 8192, 1)
    x = d.sample(np.random.default_rng(1), 200_000)
    assert np.median(x) == pytest.approx(250, rel=0.02)
    assert np.percentile(x, 90) == pytest.approx(1000, rel=0.03)
    assert x.max() <= 8192
    ints = d.sample_int(np.random.default_rng(1), 1000)
    assert min(ints) >= 1 and all(isinstance(v, int) for v in ints)


@pytest.mark.parametrize(
    ("median", "p90", "cap", "floor"),
    [(250, 1000, 8192, 1), (3.0, 40.0, 600.0, 0.0), (2.5, 2.5, 9.0, 0.0), (0.6, 4.0, 3.0, 0.5)],
)
def test_list_sampling_equals_the_numpy_expressions(
    median: float, p90: float, cap: float, floor: float
) -> None:
    """``sample_list``/``sample_int`` clip and round per element in Python: they must give
    exactly the values of the numpy expressions on the same draws (halves included)."""
    d = LogNormal(median, p90, cap, floor)
    for seed in range(20):
        rng = np.random.default_rng(seed)
        raw = rng.lognormal(d.mu, d.sigma, 300) if d.sigma > 0 else np.full(300, math.exp(d.mu))
        arr = np.clip(raw, floor, cap)
        assert d.sample_list(np.random.default_rng(seed), 300) == arr.tolist()
        assert d.sample(np.random.default_rng(seed), 300).tolist() == arr.tolist()
        low = max(1, int(np.ceil(floor)))
        expect = np.maximum(np.rint(arr).astype(np.int64), low).tolist()
        assert d.sample_int(np.random.default_rng(seed), 300) == expect
    halves = [0.5, 1.5, 2.5, 3.49999, 4.5, 8.5]
    assert [round(x) for x in halves] == np.rint(halves).astype(np.int64).tolist()


def test_a_degenerate_lognormal_is_constant() -> None:
    x = LogNormal(5.0, 5.0, 10.0).sample(np.random.default_rng(0), 10)
    assert np.allclose(x, 5.0)


def test_quantile_table_reproduces_the_stated_quantiles() -> None:
    d = QuantileTable([(0.0, 3), (0.5, 29), (0.9, 56), (0.99, 85), (1.0, 100)])
    x = d.sample(np.random.default_rng(2), 200_000)
    assert np.median(x) == pytest.approx(29, rel=0.02)
    assert np.percentile(x, 90) == pytest.approx(56, rel=0.02)
    assert np.percentile(x, 99) == pytest.approx(85, rel=0.02)
    assert x.max() <= 100 and x.min() >= 3


@pytest.mark.parametrize(
    "make",
    [
        lambda: LogNormal(0, 10, 100),
        lambda: LogNormal(10, 5, 100),
        lambda: LogNormal(10, 20, 1, floor=5),
        lambda: QuantileTable([(0.0, 1), (0.5, 2)]),
        lambda: QuantileTable([(0.0, 5), (1.0, 2)]),
    ],
)
def test_bad_parameters_are_config_errors(make: object) -> None:
    with pytest.raises(ConfigError):
        make()  # type: ignore[operator]
