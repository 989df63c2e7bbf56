"""Trace loaders: valid files load; malformed ones name the file, line and field."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from sessionroute.errors import ConfigError, TraceFormatError
from sessionroute.workloads.mooncake import load_mooncake, load_mooncake_sessions
from sessionroute.workloads.traces import TRACES_ENV, resolve_trace
from sessionroute.workloads.weka import WEKA_COLUMNS, load_weka

HEADER = ",".join(WEKA_COLUMNS)
GOOD_ROWS = [
    "0,1,0,0,0.0,1000,10,0,-1,2.0,0.0,0,tool_use",
    "1,1,0,1,5.0,1200,20,960,0,3.5,3.0,0,end_turn",
    "2,1,1,0,9.0,300,0,0,-1,,,1,",
]


def _weka(tmp_path: Path, rows: list[str], header: str = HEADER) -> Path:
    p = tmp_path / "weka.csv"
    p.write_text("\n".join([header, *rows]) + "\n", encoding="utf-8")
    return p


def test_a_valid_weka_file_loads_with_empty_times_as_none(tmp_path: Path) -> None:
    trace = load_weka(_weka(tmp_path, GOOD_ROWS))
    assert len(trace.rows) == 3
    assert trace.sessions == {1: [0, 1, 2]}
    assert trace.rows[2].api_time is None and trace.rows[2].think_time is None
    assert trace.rows[1].cached_tokens == 960 and trace.rows[1].match_row == 0


@pytest.mark.parametrize(
    ("bad_row", "field"),
    [
        ("2,1,0,2,x,100,1,0,-1,1,1,0,s", "t"),
        ("2,1,0,2,1.0,0,1,0,-1,1,1,0,s", "input_tokens"),
        ("2,1,0,2,1.0,100,-1,0,-1,1,1,0,s", "output_tokens"),
        ("2,1,0,2,1.0,2000,1,100,1,1,1,0,s", "cached_tokens"),  # not a multiple of 64
        ("2,1,0,2,1.0,2000,1,1216,1,1,1,0,s", "cached_tokens"),  # beyond row 1's full blocks
        ("2,1,0,2,1.0,2000,1,64,-1,1,1,0,s", "match_row"),  # cached without a match
        ("2,1,0,2,1.0,2000,1,64,5,1,1,0,s", "match_row"),  # not an earlier row
        ("2,2,0,0,1.0,2000,1,64,1,1,1,0,s", "match_row"),  # another session
        ("7,1,0,2,1.0,100,1,0,-1,1,1,0,s", "row"),  # out of sequence
        ("2,1,0,2,1.0,100,1,0,-1,1,1,0", "row"),  # missing a field
        ("2,1,0,2,1.0,100,1,0,-1,nan,1,0,s", "api_time"),
        ("2,1,0,2,1.0,100,1,0,-1,1,1,0,s", "t"),  # before the session's previous row (5.0)
    ],
)
def test_a_malformed_weka_row_names_file_line_and_field(
    tmp_path: Path, bad_row: str, field: str
) -> None:
    path = _weka(tmp_path, [*GOOD_ROWS[:2], bad_row])
    with pytest.raises(TraceFormatError) as info:
        load_weka(path)
    err = info.value
    assert (err.path, err.line, err.field) == (str(path), 4, field)
    assert str(path) in str(err) and field in str(err)


def test_a_weka_file_missing_a_column_is_refused(tmp_path: Path) -> None:
    path = _weka(tmp_path, ["0,1,0,0,0.0,1000,10,0,-1,2.0,0.0,0"], header=HEADER[: -len(",stop")])
    with pytest.raises(TraceFormatError) as info:
        load_weka(path)
    assert (info.value.line, info.value.field) == (1, "stop")


def _mooncake(tmp_path: Path, lines: list[str]) -> Path:
    p = tmp_path / "mc.jsonl"
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return p


GOOD_MC = [
    json.dumps({"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}),
    json.dumps({"timestamp": 10, "input_length": 1100, "output_length": 7, "hash_ids": [0, 1, 2]}),
]


def test_a_valid_mooncake_file_and_sessions_load(tmp_path: Path) -> None:
    trace = load_mooncake(_mooncake(tmp_path, GOOD_MC))
    assert [r.hash_ids for r in trace.requests] == [(0, 1), (0, 1, 2)]
    s = tmp_path / "s.csv"
    s.write_text("row,session,turn,parent_row\n0,0,1,-1\n1,0,2,0\n", encoding="utf-8")
    assert load_mooncake_sessions(s, 2) == [0, 0]


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ("{not json", "<line>"),
        ("[1, 2]", "<line>"),
        (json.dumps({"timestamp": 20, "output_length": 1, "hash_ids": [0]}), "input_length"),
        (
            json.dumps({"timestamp": 20, "input_length": 600, "output_length": 1, "hash_ids": [0]}),
            "hash_ids",
        ),
        (
            json.dumps({"timestamp": 20, "input_length": 6, "output_length": 1, "hash_ids": ["a"]}),
            "hash_ids",
        ),
        (
            json.dumps({"timestamp": 5, "input_length": 6, "output_length": 1, "hash_ids": [0]}),
            "timestamp",
        ),
        (
            json.dumps({"timestamp": 20, "input_length": 6, "output_length": 1.5, "hash_ids": [0]}),
            "output_length",
        ),
    ],
)
def test_a_malformed_mooncake_line_names_file_line_and_field(
    tmp_path: Path, bad: str, field: str
) -> None:
    path = _mooncake(tmp_path, [*GOOD_MC, bad])
    with pytest.raises(TraceFormatError) as info:
        load_mooncake(path)
    assert (info.value.path, info.value.line, info.value.field) == (str(path), 3, field)


@pytest.mark.parametrize(
    ("rows", "line", "field"),
    [
        ("0,0,1,-1\n2,0,2,0\n", 3, "row"),
        ("0,0,1,-1\n1,1,2,0\n", 3, "parent_row"),
        ("0,0,1,-1\n1,0,0,0\n", 3, "turn"),
        ("0,0,1,-1\n", 3, "row"),  # fewer rows than requests
    ],
)
def test_a_malformed_sessions_file_is_refused(
    tmp_path: Path, rows: str, line: int, field: str
) -> None:
    s = tmp_path / "s.csv"
    s.write_text("row,session,turn,parent_row\n" + rows, encoding="utf-8")
    with pytest.raises(TraceFormatError) as info:
        load_mooncake_sessions(s, 2)
    assert (info.value.line, info.value.field) == (line, field)


def test_trace_lookup_uses_the_environment_then_fails_clearly(tmp_path: Path) -> None:
    (tmp_path / "x.csv").write_text("", encoding="utf-8")
    assert resolve_trace("x.csv", env={TRACES_ENV: str(tmp_path)}) == tmp_path / "x.csv"
    with pytest.raises(ConfigError, match=TRACES_ENV):
        resolve_trace("no-such-trace.csv", env={TRACES_ENV: str(tmp_path)})


def test_a_gzip_trace_is_found_by_its_plain_name_and_loads_as_the_plain_file(
    tmp_path: Path,
) -> None:
    plain = _weka(tmp_path, GOOD_ROWS)
    packed = tmp_path / "packed"
    packed.mkdir()
    (packed / "weka.csv.gz").write_bytes(gzip.compress(plain.read_bytes()))
    found = resolve_trace("weka.csv", env={TRACES_ENV: str(packed)})
    assert found == packed / "weka.csv.gz"
    assert resolve_trace(str(packed / "weka.csv")) == found  # a path without its .gz too
    assert load_weka(found).rows == load_weka(plain).rows
    mc = _mooncake(tmp_path, GOOD_MC)
    mc_gz = packed / "mc.jsonl.gz"
    mc_gz.write_bytes(gzip.compress(mc.read_bytes()))
    assert load_mooncake(mc_gz).requests == load_mooncake(mc).requests


def test_a_gzip_file_is_recognised_by_its_bytes_not_its_name(tmp_path: Path) -> None:
    plain = _weka(tmp_path, GOOD_ROWS)
    disguised = tmp_path / "disguised.csv"
    disguised.write_bytes(gzip.compress(plain.read_bytes()))
    assert load_weka(disguised).rows == load_weka(plain).rows


def test_a_directory_given_as_a_trace_is_named_as_such(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is a directory"):
        resolve_trace(str(tmp_path), env={TRACES_ENV: str(tmp_path)})


def test_a_place_reached_two_ways_is_listed_once(tmp_path: Path) -> None:
    """The environment's directory and a default one can be the same place: the error names
    each place once."""
    from sessionroute.workloads.traces import trace_dirs

    same = trace_dirs({})[0]
    with pytest.raises(ConfigError) as info:
        resolve_trace("no-such-trace.csv", env={TRACES_ENV: str(same)})
    msg = str(info.value)
    listed = msg.split("looked at ", 1)[1].split(")", 1)[0].split(", ")
    assert len(listed) == len(set(listed)) >= 2
    assert str((same / "no-such-trace.csv").resolve()) in listed


@pytest.mark.parametrize("prefix", ["trace:", ""])
def test_a_weka_csv_by_absolute_path_replays_with_or_without_trace_prefix(
    tmp_path: Path, prefix: str
) -> None:
    import numpy as np

    from sessionroute.workloads.registry import canonical_kind, workload_config

    path = _weka(tmp_path, GOOD_ROWS)
    kind = f"{prefix}{path}"
    assert canonical_kind(kind) == "trace:weka"
    cfg = workload_config(kind, None, {"concurrency": 2})
    from sessionroute.workloads.weka_replay import WekaReplay

    workload = cfg.build(np.random.default_rng(0))
    assert isinstance(workload, WekaReplay)
    assert workload.trace.path == str(path)
    assert [len(rows) for rows in workload.trace.sessions.values()] == [3]  # one session, 3 rows


@pytest.mark.parametrize("prefix", ["trace:", ""])
def test_a_mooncake_jsonl_of_ones_own_replays_by_path_one_session_per_request(
    tmp_path: Path, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The public trace's sessions CSV numbers that trace's rows: a file of one's own gets no
    sessions file unless one is named, and a sessions file that does not fit says what to do."""
    import numpy as np

    from sessionroute.workloads.mooncake_replay import MooncakeReplay, MooncakeReplayConfig
    from sessionroute.workloads.registry import canonical_kind, workload_config

    monkeypatch.setenv(TRACES_ENV, str(tmp_path))  # where the public sessions CSV would be
    path = _mooncake(tmp_path, GOOD_MC)
    kind = f"{prefix}{path}"
    assert canonical_kind(kind) == "trace:mooncake"
    cfg = workload_config(kind)
    assert isinstance(cfg, MooncakeReplayConfig) and cfg.sessions_path is None
    workload = cfg.build(np.random.default_rng(0))
    assert isinstance(workload, MooncakeReplay)
    assert workload.stats["sessions_total"] == 2

    (tmp_path / "mooncake_conversation_sessions.csv").write_text(
        "row,session,turn,parent_row\n0,0,1,-1\n1,0,2,0\n2,0,3,1\n", encoding="utf-8"
    )
    named = workload_config(kind, None, {"sessions_path": "mooncake_conversation_sessions.csv"})
    with pytest.raises(TraceFormatError, match='sessions_path = "" replays one session per'):
        named.build(np.random.default_rng(0))
    public = workload_config("trace:mooncake", None, {"path": str(path)})
    assert isinstance(public, MooncakeReplayConfig) and public.sessions_path is None
    own_name = tmp_path / "mooncake_conversation_trace.jsonl"
    own_name.write_text(path.read_text("utf-8"), encoding="utf-8")
    named_as_public = workload_config(str(own_name))
    assert isinstance(named_as_public, MooncakeReplayConfig)
    assert named_as_public.sessions_path == "mooncake_conversation_sessions.csv"
