"""Policy options as written (name(key=value), policy files) and the declared tuning knobs."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sessionroute.cli import build_parser
from sessionroute.cli.experiment_args import experiment_from_args
from sessionroute.errors import ConfigError
from sessionroute.experiments.spec import resolve_arms
from sessionroute.router.policies.options import (
    Knob,
    format_policy,
    knob,
    knobs,
    load_policy_file,
    parse_policy,
    policy_file_text,
    split_policies,
)
from sessionroute.router.policies.registry import make_config, policy_class, policy_names


def test_split_keeps_options_together() -> None:
    text = "consistent_hash_bounded_load(c=1.05),adaptive_sticky, cache_aware(a=1, b=2)"
    assert split_policies(text) == [
        "consistent_hash_bounded_load(c=1.05)",
        "adaptive_sticky",
        "cache_aware(a=1, b=2)",
    ]


@pytest.mark.parametrize("bad", ["a(b=1", "a)b", "", " , "])
def test_split_names_bad_lists(bad: str) -> None:
    with pytest.raises(ConfigError):
        split_policies(bad)


def test_parse_reads_toml_scalars_and_bare_words() -> None:
    name, options = parse_policy('p(x=1, y=0.5, z=true, w="a b", v=word)')
    assert name == "p"
    assert options == {"x": 1, "y": 0.5, "z": True, "w": "a b", "v": "word"}
    assert parse_policy("  plain ") == ("plain", {})
    assert parse_policy("pkg.mod:Cls(k=2)") == ("pkg.mod:Cls", {"k": 2})


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ("p(x)", "key=value"),
        ("p(x=1, x=2)", "given twice"),
        ("p(x=1", "end with ')'"),
        ("(x=1)", "no policy name"),
        ("p(=1)", "key=value"),
        ("p(x=)", "empty value"),
        ('p(x="unterminated)', "cannot read"),
    ],
)
def test_parse_names_the_text(bad: str, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_policy(bad)
    assert says in str(err.value)


_keys = st.from_regex(r"[a-z][a-z_]{0,8}", fullmatch=True)
_values = st.one_of(
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(-1e6, 1e6, allow_nan=False),
    st.text('abc xyz-_.,()"\\', max_size=8),
)


@given(st.dictionaries(_keys, _values, max_size=4))
def test_format_then_parse_round_trips(options: dict[str, object]) -> None:
    assert parse_policy(format_policy("some_policy", options)) == ("some_policy", options)


def test_policy_file_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "tuned.toml"
    path.write_text(policy_file_text("cache_aware", {"cache_threshold": 0.5}, {"trials": 40}))
    assert load_policy_file(path) == ("cache_aware", {"cache_threshold": 0.5})


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("options = {}", "'policy' must be"),
        ('policy = "p"\noptions = 3', "'options' must be a table"),
        ('policy = "p"\nextra = 1', "unknown key"),
        ("policy = ", "tuned.toml"),
    ],
)
def test_policy_file_errors_name_the_file(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "tuned.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_policy_file(path)
    assert says in str(err.value) and "tuned.toml" in str(err.value)
    with pytest.raises(ConfigError, match="not found"):
        load_policy_file(tmp_path / "missing.toml")


def test_declared_knobs_hold_their_defaults() -> None:
    assert set(knobs(policy_class("consistent_hash_bounded_load"))) == {"c"}
    assert set(knobs(policy_class("cache_aware"))) == {
        "cache_threshold",
        "balance_abs_threshold",
        "balance_rel_threshold",
    }
    for name in policy_names():
        cls = policy_class(name)
        for option, spec in knobs(cls).items():
            default = getattr(make_config(cls, {}), option)
            assert spec.default == default and spec.low <= default <= spec.high, (name, option)
            for edge in (spec.low, spec.high):  # the policy accepts the whole range
                make_config(cls, {option: int(edge) if spec.integer else float(edge)})


def test_knob_rejects_defaults_outside_its_range() -> None:
    with pytest.raises(ConfigError):
        knob(3.0, 1.0, 2.0)
    with pytest.raises(ConfigError):
        Knob(0.0, 1.0, log=True)
    assert "log" in Knob(1, 256, log=True, integer=True, default=64).describe()


def _compare_args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["compare", *argv])


def test_compare_policies_take_options_and_files(tmp_path: Path) -> None:
    tuned = tmp_path / "tuned.toml"
    tuned.write_text(policy_file_text("consistent_hash_bounded_load", {"c": 1.1}))
    args = _compare_args(
        "--policies",
        f"consistent_hash_bounded_load(c=1.05),consistent_hash_bounded_load,@{tuned}",
    )
    arms = resolve_arms(experiment_from_args(args))
    shown = [(a.name, a.policy, a.policy_options) for a in arms]
    assert shown == [
        ("consistent_hash_bounded_load(c=1.05)", "consistent_hash_bounded_load", {"c": 1.05}),
        ("consistent_hash_bounded_load", "consistent_hash_bounded_load", {}),
        ("consistent_hash_bounded_load(c=1.1)", "consistent_hash_bounded_load", {"c": 1.1}),
    ]


def test_compare_policies_reject_unknown_options() -> None:
    args = _compare_args("--policies", "consistent_hash_bounded_load(k=2)")
    with pytest.raises(ConfigError, match="unknown option"):
        experiment_from_args(args)
