"""Step-time profiles: ENGINE.md sanity table and user profile files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sessionroute.errors import ConfigError
from sessionroute.replica import PROFILES, load_profiles

GLM = PROFILES["glm45air-h200-tp8"]


@pytest.mark.parametrize(
    ("p", "d", "c", "a", "expected_s"),
    [
        (0, 1, 2000, 0.0, 5.4e-3),  # 1 sequence at 2k context
        (0, 256, 256 * 2000, 0.0, 15.9e-3),  # 256 sequences at 2k
        (0, 40, 40 * 100_000, 0.0, 39.8e-3),  # 40 sequences at 100k
        (8192, 0, 0, 8192 * (0 + 8192 / 2), 159e-3),  # fresh 8192-token chunk
        (700, 0, 0, 700 * (100_000 + 700 / 2), 65e-3),  # 700 new tokens on a 100k prefix
    ],
)
def test_glm_sanity_table_within_2_percent(
    p: int, d: int, c: int, a: float, expected_s: float
) -> None:
    assert GLM.step_time(p, d, c, a) == pytest.approx(expected_s, rel=0.02)


def test_toy_profile_is_dense() -> None:
    toy = PROFILES["toy-8b-h100-tp1"]
    assert toy.t_mem(1) == toy.t_mem(4096) == pytest.approx(16e9 / 2.35e12)
    assert toy.step_time(0, 1, 1000, 0.0) == pytest.approx(1e-3 + 16e9 / 2.35e12 + 56e-6)


def test_load_profiles_toml_with_base(tmp_path: Path) -> None:
    f = tmp_path / "p.toml"
    f.write_text('[profiles.mine]\nbase = "toy-8b-h100-tp1"\nb0_s = 0.002\nmax_num_seqs = 64\n')
    profiles = load_profiles(f)
    mine = profiles["mine"]
    assert mine.name == "mine" and mine.b0_s == 0.002 and mine.max_num_seqs == 64
    assert mine.b_kv_s == PROFILES["toy-8b-h100-tp1"].b_kv_s
    assert "glm45air-h200-tp8" in profiles


def test_load_profiles_json_full(tmp_path: Path) -> None:
    f = tmp_path / "p.json"
    fields = {k: v for k, v in GLM.__class__.__dataclass_fields__.items() if k != "name"}
    data = {k: getattr(GLM, k) for k in fields}
    data["b0_s"] = 0.01
    f.write_text(json.dumps({"x": data}))
    assert load_profiles(f)["x"].step_time(0, 1, 0, 0.0) > GLM.step_time(0, 1, 0, 0.0)


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ('[profiles.m]\nbase = "nope"\n', "unknown base"),
        ('[profiles.m]\nbase = "toy-8b-h100-tp1"\nfoo = 1\n', "unknown key"),
        ('[profiles.m]\nbase = "toy-8b-h100-tp1"\nb0_s = "x"\n', "must be a number"),
        ('[profiles.m]\nbase = "toy-8b-h100-tp1"\nb0_s = -1\n', ">= 0"),
        ('[profiles.m]\nbase = "toy-8b-h100-tp1"\nmax_num_seqs = 1.5\n', "integer"),
        ("[profiles.m]\nb0_s = 1\n", "missing keys"),
        ("not toml [", "cannot read"),
    ],
)
def test_load_profiles_errors(tmp_path: Path, body: str, match: str) -> None:
    f = tmp_path / "p.toml"
    f.write_text(body)
    with pytest.raises(ConfigError, match=match):
        load_profiles(f)
