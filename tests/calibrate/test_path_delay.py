"""The request path's delay (``compare --fidelity``'s path probe): its fit, the profile file it
is written to, and the simulator applying it."""

from __future__ import annotations

from pathlib import Path

import pytest

from sessionroute.calibrate import write_profile
from sessionroute.calibrate.path import PathFit, PathSample, fit_path_delay, isotonic
from sessionroute.errors import ConfigError
from sessionroute.experiments.spec import load_experiment, resolve_arms
from sessionroute.replica import load_profile_file
from sessionroute.replica.profiles import PROFILES
from sessionroute.sim import SimSpec, replica_config

from .test_profile_file import _experiment, _result, simulate_one_turn


def _samples(d0: float, d1: float, noise: list[float]) -> list[PathSample]:
    return [
        PathSample(n, d0 + d1 * n + noise[(n + k) % len(noise)])
        for n in range(0, 10)
        for k in range(6)
    ]


def test_a_delay_that_grows_with_requests_in_flight_is_fitted_as_a_line() -> None:
    fit = fit_path_delay(_samples(0.030, 0.004, [-0.001, 0.0, 0.001]))
    assert fit.load_dependent
    assert fit.d0_s == pytest.approx(0.030, abs=5e-4)
    assert fit.d1_s == pytest.approx(0.004, abs=1e-4)
    assert fit.d0_err is not None and fit.d0_err < 0.1
    assert fit.delay_s(5) == pytest.approx(0.050, abs=1e-3)
    assert fit.samples == 60 and len(fit.bins) == 5  # pairs of counts: 12 requests each
    assert [n for n, _, _ in fit.bins] == [0.5, 2.5, 4.5, 6.5, 8.5]


def test_a_flat_delay_is_a_constant_the_median() -> None:
    fit = fit_path_delay(_samples(0.040, 0.0, [-0.01, 0.0, 0.01, 0.002, -0.002]))
    assert not fit.load_dependent
    assert fit.d1_s == 0.0 and fit.d1_err is None
    assert fit.d0_s == pytest.approx(0.040, abs=1e-3)


def test_a_negative_delay_is_fitted_as_zero() -> None:
    fit = fit_path_delay([PathSample(0, -0.002)] * 5)
    assert fit.d0_s == 0.0 and fit.d0_err is None
    with pytest.raises(ValueError, match="no path probe"):
        fit_path_delay([])


def _path() -> PathFit:
    return fit_path_delay(_samples(0.030, 0.004, [0.0]), {"runs": [{"run": "light"}]})


def test_the_path_delay_round_trips_through_the_profile_file(tmp_path: Path) -> None:
    result = _result().with_path(_path())
    path = write_profile(result, tmp_path / "profile.toml")
    pf = load_profile_file(path)
    assert pf.profile == result.profile
    assert pf.profile.path_delay_s == pytest.approx(0.030)
    assert pf.profile.path_delay_per_request_s == pytest.approx(0.004)
    table = pf.calibration["path"]
    assert table["load_dependent"] is True and table["samples"] == 60
    assert table["runs"] == [{"run": "light"}]
    assert set(table["fit_error"]) == {"path_delay_s", "path_delay_per_request_s"}
    assert pf.profile.path_delay_curve and len(table["curve"]) == len(table["bins"])
    # and through [replicas] profile into the simulator's replica configuration
    (arm,) = resolve_arms(load_experiment(_experiment(tmp_path, path)))
    _, cfg = replica_config(SimSpec.from_settings(arm.settings))
    assert cfg.profile.path_delay_s == pytest.approx(0.030)


def _ttft_p50(tmp_path: Path, name: str, d0: float, d1: float, sessions: int) -> float:
    result = _result()
    if d0 or d1:
        fit = fit_path_delay([PathSample(n, d0 + d1 * n) for n in range(3) for _ in range(12)])
        result = result.with_path(fit)
    path = write_profile(result, tmp_path / f"{name}.toml")
    return float(simulate_one_turn(tmp_path, path, sessions)["ttft_s"]["p50"])


def test_the_simulator_adds_the_path_delay_to_a_request(tmp_path: Path) -> None:
    """One session, one turn: its TTFT grows by the path delay exactly."""
    base = _ttft_p50(tmp_path, "none", 0.0, 0.0, 1)
    assert _ttft_p50(tmp_path, "const", 0.050, 0.0, 1) == pytest.approx(base + 0.050, abs=1e-9)


def test_the_simulator_grows_the_delay_with_requests_in_flight(tmp_path: Path) -> None:
    """Four sessions sent together: later ones see others in flight and wait longer than the
    constant alone would make them."""
    none = _ttft_p50(tmp_path, "none", 0.0, 0.0, 4)
    const = _ttft_p50(tmp_path, "const", 0.050, 0.0, 4)
    grows = _ttft_p50(tmp_path, "grows", 0.050, 0.020, 4)
    assert const > none
    assert grows > const + 0.015


def test_the_line_is_anchored_at_the_requests_sent_alone() -> None:
    """A delay that jumps once a couple of others are in flight: d0 stays the idle requests'
    median (an unanchored line would put it far above)."""
    samples = [PathSample(0, 0.010)] * 12 + [
        PathSample(n, 0.100 + 0.005 * n + (0.01 if k % 2 else -0.01))
        for n in range(2, 12)
        for k in range(12)
    ]
    fit = fit_path_delay(samples)
    assert fit.load_dependent
    assert fit.d0_s == pytest.approx(0.010)
    assert fit.delay_s(0) < 0.02 and fit.delay_s(6) > 0.05


def test_a_delay_that_grows_faster_once_the_host_saturates_is_followed_by_its_curve() -> None:
    """The CI tier's light file, 2026-12-07: median path delay (ms) by others in flight 0: 0,
    1: 8, 2: 19, 3.6: 42 ... 13.8: 265. The line through them says 29 ms at 2 in flight; the
    simulator interpolates the bins instead."""
    medians = {0: 0.0, 1: 0.008, 2: 0.019, 4: 0.042, 8: 0.107, 10: 0.148, 14: 0.265}
    samples = [PathSample(n, d + e) for n, d in medians.items() for e in (-1e-3, 1e-3) * 6]
    fit = fit_path_delay(samples)
    assert fit.load_dependent
    assert fit.d0_s + 2 * fit.d1_s > 0.025  # the line overstates it where the arms run
    assert fit.delay_s(1) == pytest.approx(0.008) and fit.delay_s(2) == pytest.approx(0.019)
    assert fit.delay_s(3) == pytest.approx((0.019 + 0.042) / 2)
    assert fit.delay_s(20) == pytest.approx(0.265)  # held past the last bin


def test_isotonic_pools_a_dip_with_its_neighbour() -> None:
    assert isotonic([0.0, 0.02, 0.01, 0.03], [1, 1, 1, 1]) == pytest.approx(
        [0.0, 0.015, 0.015, 0.03]
    )
    assert isotonic([0.05, 0.01, 0.02], [1, 3, 1]) == pytest.approx([0.02, 0.02, 0.02])
    assert isotonic([0.01, 0.02], [1, 1]) == [0.01, 0.02]


def test_the_profile_interpolates_its_curve_else_the_line() -> None:
    import dataclasses

    base = PROFILES["toy-8b-h100-tp1"]
    line = dataclasses.replace(base, path_delay_s=0.01, path_delay_per_request_s=0.002)
    assert line.path_delay(5) == pytest.approx(0.02)
    curve = dataclasses.replace(line, path_delay_curve=((0.5, 0.01), (2.5, 0.03)))
    assert curve.path_delay(0) == 0.01 and curve.path_delay(1) == pytest.approx(0.015)
    assert curve.path_delay(9) == 0.03


@pytest.mark.parametrize(
    "value", ["[[2, 0.01], [1, 0.02]]", "[[0, -0.01]]", "[[0, 0.01, 2]]", "0.01"]
)
def test_a_bad_path_delay_curve_in_a_profile_file_is_named(tmp_path: Path, value: str) -> None:
    text = tmp_path / "p.toml"
    text.write_text(f'[profiles.p]\nbase = "toy-8b-h100-tp1"\npath_delay_curve = {value}\n')
    with pytest.raises(ConfigError, match="path_delay_curve must be a list"):
        load_profile_file(text)


def test_a_profile_that_sets_the_line_drops_its_bases_curve(tmp_path: Path) -> None:
    f = tmp_path / "p.toml"
    f.write_text(
        '[profiles.a]\nbase = "toy-8b-h100-tp1"\npath_delay_curve = [[0, 0.01], [4, 0.05]]\n'
        '[profiles.b]\nbase = "a"\npath_delay_s = 0.0\n'
        '[profiles.c]\nbase = "a"\nb0_s = 0.001\n'
    )
    from sessionroute.replica.profiles import load_profiles

    got = load_profiles(f)
    assert got["a"].path_delay(2) == pytest.approx(0.03)
    assert got["b"].path_delay_curve == () and got["b"].path_delay(2) == 0.0  # turned off
    assert got["c"].path_delay_curve == got["a"].path_delay_curve  # inherited


def test_the_fidelity_output_prints_every_term_with_its_fit_error() -> None:
    from sessionroute.calibrate import TermFit
    from sessionroute.experiments.live.fidelity_run import describe_path, describe_terms

    terms = [TermFit("b0_s", 0.002, 0.0002, 0.4), TermFit("b_kv_s", 0.0, None, 0.0)]
    assert describe_terms(terms) == "b0_s 0.002 s (±10%); b_kv_s 0 s (at 0)"
    # calibrate's table words the same errors from the same function, at its precision
    unknown = TermFit("b_tok_s", 0.001, None, 0.1)
    assert [t.error_text() for t in (*terms, unknown)] == ["10.0%", "at bound 0", "?"]
    line = describe_path(_path())
    assert line.startswith("path delay 30.0 ms (±") and "+ 4.00 ms (±" in line
    assert "per other request in flight" in line
    assert line.endswith(
        "; the simulator interpolates them, made non-decreasing (0.5: 32, "
        "2.5: 40, 4.5: 48, 6.5: 56, 8.5: 64)"
    )
