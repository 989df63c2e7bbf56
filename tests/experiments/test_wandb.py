"""``--wandb`` in offline mode: one W&B run per arm, read back from what wandb wrote."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sessionroute.cli import main
from sessionroute.experiments.results import RunOutput
from sessionroute.experiments.spec import WandbSection
from sessionroute.experiments.tracking import history_rows, resolve_mode, run_name

_TINY = """
name = "tiny"
[workload]
kind = "swe-rl"
steps = 2
[workload.options]
batch_size = 8
group_size = 4
turns_p50 = 4
turns_p90 = 6
turns_p99 = 8
turns_max = 10
[replicas]
count = 2
profile = "toy-8b-h100-tp1"
[[arms]]
policy = "consistent_hash"
[[arms]]
policy = "sticky_least_loaded"
"""


def _records(path: Path) -> Iterator[bytes]:
    """The records of a ``.wandb`` file: a 7-byte header (``:W&B``, key, version), then
    LevelDB-log blocks of 32 KiB whose records carry a 7-byte header (CRC, length, type:
    1 full, 2 first, 3 middle, 4 last)."""
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, buf = 7, b""
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 1:
            yield chunk
        elif kind == 2:
            buf = chunk
        elif kind == 3:
            buf += chunk
        elif kind == 4:
            yield buf + chunk
            buf = b""


def _key(item: Any) -> str:
    """An item's key: ``key``, or ``nested_key`` joined (how wandb stores some keys)."""
    return str(item.key or "/".join(item.nested_key))


def _read_run(path: Path) -> dict[str, Any]:
    from wandb.proto import wandb_internal_pb2 as pb

    out: dict[str, Any] = {"history": [], "summary": {}, "artifacts": []}
    for data in _records(path):
        rec = pb.Record()  # type: ignore[attr-defined]
        rec.ParseFromString(data)
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            out.update(name=rec.run.display_name, group=rec.run.run_group, project=rec.run.project)
        elif kind == "history":
            out["history"].append({_key(i): json.loads(i.value_json) for i in rec.history.item})
        elif kind == "summary":
            for i in rec.summary.update:
                out["summary"][_key(i)] = json.loads(i.value_json)
        elif kind == "artifact":
            out["artifacts"].append(sorted(m.path for m in rec.artifact.manifest.contents))
    return out


def test_offline_compare_writes_one_run_per_arm_with_history_summary_and_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("wandb", reason="wandb is not installed: pip install 'sessionroute[wandb]'")
    for var in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_DIR", "WANDB_PROJECT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc login: offline
    monkeypatch.setenv("WANDB_SILENT", "true")
    exp = tmp_path / "tiny.toml"
    exp.write_text(_TINY, encoding="utf-8")
    out = tmp_path / "run"
    rc = main(["compare", str(exp), "--jobs", "1", "--wandb", "srtest", "--out", str(out)])
    assert rc == 0
    assert "W&B (offline)" in capsys.readouterr().out
    files = sorted((out / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 2
    runs = {r["name"]: r for r in map(_read_run, files)}
    assert set(runs) == {"consistent-hash", "sticky-least-loaded"}
    results = json.loads((out / "results.json").read_text())
    groups = {r["group"] for r in runs.values()}
    assert len(groups) == 1 and groups.pop().startswith("tiny-")
    for arm in results["arms"]:
        run = runs[run_name(arm["name"])]
        assert run["project"] == "srtest"
        # per-RL-step history: one row per step, the step time of results.json's steps
        assert [h["rl_step"] for h in run["history"]] == [1, 2]
        assert max(h["step_time_s"] for h in run["history"]) == pytest.approx(
            arm["metrics"]["step_time_s"]["max"]
        )
        assert all(h["output_tokens_per_s"] > 0 for h in run["history"])
        # the final metrics as summary, nested keys flattened
        assert run["summary"]["output_tokens_per_s"] == pytest.approx(
            arm["metrics"]["output_tokens_per_s"]
        )
        assert run["summary"]["group_latency_s.p50"] == pytest.approx(
            arm["metrics"]["group_latency_s"]["p50"]
        )
        assert run["artifacts"] == [["report.html", "results.json"]]


def test_mode_is_offline_without_an_api_key(tmp_path: Path) -> None:
    s = WandbSection(project="p")
    assert resolve_mode(s, {"NETRC": str(tmp_path / "none")}) == "offline"
    assert resolve_mode(s, {"WANDB_API_KEY": "x"}) == "online"
    netrc = tmp_path / "netrc"
    netrc.write_text("machine api.wandb.ai\n  login user\n  password k\n", encoding="utf-8")
    assert resolve_mode(s, {"NETRC": str(netrc)}) == "online"
    assert resolve_mode(WandbSection(project="p", mode="offline"), {"WANDB_API_KEY": "x"}) == (
        "offline"
    )


def test_history_rows_rate_is_over_each_step() -> None:
    run = RunOutput(
        seed=0,
        metrics={},
        steps=[
            {"step": 1, "t": 100.0, "step_time_s": 100.0, "output_tokens": 5000,
             "sessions_cancelled": 0},
            {"step": 2, "t": 150.0, "step_time_s": 50.0, "output_tokens": 6000,
             "sessions_cancelled": 3},
        ],
    )  # fmt: skip
    rows = history_rows(run)
    assert [r["output_tokens_per_s"] for r in rows] == [50.0, 20.0]
    assert rows[1]["sessions_cancelled"] == 3.0
    assert run_name("sticky_least_loaded") == "sticky-least-loaded"
    assert run_name("bounded_c1.05", 2) == "bounded-c1.05-seed2"
