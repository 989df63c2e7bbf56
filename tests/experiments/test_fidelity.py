"""Simulator vs live comparison (``compare --fidelity``): errors, bounds, rank agreement,
engine settings of a ``[live]`` file, the report section."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sessionroute.errors import ConfigError
from sessionroute.experiments.fidelity import (
    compare_arm,
    fidelity_document,
    kendall_tau,
    rank_agreement,
    ttft_split,
)
from sessionroute.experiments.fidelity_report import (
    add_report_section,
    fidelity_rows,
    print_fidelity,
)
from sessionroute.experiments.live_engine import (
    live_engine_settings,
    profile_note,
    vllm_kv_tokens,
)
from sessionroute.experiments.results import ArmResult, RunOutput


def _m(hit: float, tok: float, ttft: float = 0.1, itl: float = 0.01, pre: int = 0) -> Any:
    return {
        "prefix_cache_hit_rate": hit,
        "output_tokens_per_s": tok,
        "ttft_s": {"p50": ttft},
        "itl_s": {"p50": itl},
        "turn_latency_s": {"p50": 1.0},
        "preemptions": pre,
    }


def test_compare_arm_errors_and_bounds() -> None:
    c = compare_arm([_m(0.51, 105.0), _m(0.51, 105.0)], [_m(0.54, 115.5, ttft=0.2, pre=3)])
    assert c["hit_rate"]["live_mean"] == pytest.approx(0.51)
    assert c["hit_rate"]["error"] == pytest.approx(3.0)  # points
    assert c["hit_rate"]["ok"] is True  # 3.0 <= 3
    assert c["output_tok_s"]["error"] == pytest.approx(10.0)  # 115.5 vs 105: +10 %
    assert c["output_tok_s"]["ok"] is True
    assert c["ttft_p50"]["error"] == pytest.approx(100.0)
    assert c["ttft_p50"]["ok"] is False
    assert c["turn_latency_p50"]["ok"] is None  # reported, no bound
    assert c["preemptions"]["ok"] is False  # the simulator preempted, live did not


def test_the_bound_widens_by_the_measured_noise_of_both_sides() -> None:
    # live 0.50 and 0.54 (range 4 points), simulated draws 0.40 and 0.44 (range 4 points)
    c = compare_arm([_m(0.50, 100), _m(0.54, 100)], [_m(0.40, 100), _m(0.44, 100)])
    assert c["hit_rate"]["error"] == pytest.approx(-10.0)
    assert c["hit_rate"]["noise"] == pytest.approx(4.0)
    assert c["hit_rate"]["ok"] is False  # 10 > 3 + 4
    c = compare_arm([_m(0.50, 100), _m(0.54, 100)], [_m(0.46, 100), _m(0.50, 100)])
    assert c["hit_rate"]["ok"] is True  # |-4| <= 3 + 4


def test_a_bounded_metric_measured_on_one_side_only_fails() -> None:
    live = _m(0.5, 100.0)
    live["itl_s"] = {"p50": None}
    assert compare_arm([live], [_m(0.5, 100.0)])["itl_p50"]["ok"] is False


def test_kendall_tau() -> None:
    assert kendall_tau([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert kendall_tau([1, 2, 3], [30, 20, 10]) == pytest.approx(-1.0)
    assert kendall_tau([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(2 / 3)
    assert kendall_tau([1, 1], [1, 2]) is None
    assert kendall_tau([1], [1]) is None


def test_ties_within_the_live_spread_are_not_disagreements() -> None:
    per_arm = {
        # a and b differ by 0.01 live, less than a's own range 0.04: a tie within noise
        "a": compare_arm([_m(0.48, 100), _m(0.52, 100)], [_m(0.40, 100)]),
        "b": compare_arm([_m(0.49, 100), _m(0.49, 100)], [_m(0.45, 100)]),
        # c is clearly below both live, but the simulator puts it above
        "c": compare_arm([_m(0.20, 100), _m(0.21, 100)], [_m(0.60, 100)]),
    }
    r = rank_agreement(["a", "b", "c"], per_arm)["hit_rate"]
    pairs = {(p["a"], p["b"]): p for p in r["pairs"]}
    assert pairs[("a", "b")]["decided"] is False and pairs[("a", "b")]["agree"] is None
    assert pairs[("a", "c")]["decided"] and pairs[("a", "c")]["agree"] is False
    assert r["disagreements"] == 2
    assert r["tau"] == pytest.approx(-1.0)


def _arm(name: str, *metrics: Any) -> ArmResult:
    a = ArmResult(name, name, {})
    a.runs = [RunOutput(0, m, [], [], {}) for m in metrics]
    return a


def test_document_checks_and_report_section(tmp_path: Path) -> None:
    live = [_arm("x", _m(0.7, 100), _m(0.7, 102)), _arm("y", _m(0.3, 100), _m(0.31, 99))]
    sim = [_arm("x", _m(0.71, 104)), _arm("y", _m(0.33, 97))]
    doc = fidelity_document(live, sim, [["x", "y"]], {"profile_name": "p", "calibrated": True})
    assert doc["passed"] is True
    assert {c["what"] for c in doc["checks"]} >= {"x: hit_rate", "order of x, y: hit_rate"}
    json.dumps(doc)  # serialisable
    assert [r[1] for r in fidelity_rows(doc)][:2] == ["hit rate (%)", "output tok/s"]
    report = tmp_path / "report.html"
    report.write_text("<html><body><h1>r</h1></body></html>", "utf-8")
    add_report_section(report, doc)
    text = report.read_text("utf-8")
    assert text.index('<section id="fidelity">') < text.index("</body>")
    sim_bad = [_arm("x", _m(0.2, 104)), _arm("y", _m(0.6, 97))]
    bad = fidelity_document(live, sim_bad, [["x", "y"]], {})
    assert bad["passed"] is False
    assert any(c["what"] == "order of x, y: hit_rate" and not c["ok"] for c in bad["checks"])


def test_ttft_split_says_where_the_live_ttft_went() -> None:
    """Client TTFT = vLLM's own + what lies outside the server; queue and prefill inside it;
    the simulated TTFT and queue beside (means over runs)."""

    def live(client: float, server: float) -> Any:
        means = {"ttft_mean_s": server, "queue_mean_s": 0.1, "prefill_mean_s": 0.05}
        return {"ttft_s": {"mean": client}, "live": {"server_means": means}}

    sim = {"ttft_s": {"mean": 0.12}, "queue_time_s": {"mean": 0.04}}
    t = ttft_split([live(0.5, 0.3), live(0.7, 0.3)], [sim, sim])
    assert t["client"] == pytest.approx(0.6) and t["server"] == pytest.approx(0.3)
    assert t["outside"] == pytest.approx(0.3)
    assert (t["queue"], t["prefill"], t["sim"], t["sim_queue"]) == (0.1, 0.05, 0.12, 0.04)
    # a live run without vLLM's histograms (an emulator, an old results file): not measured
    bare = ttft_split([{"ttft_s": {"mean": 0.5}}], [sim])
    assert bare["server"] is None and bare["outside"] is None and bare["client"] == 0.5


def test_the_ttft_split_is_printed_per_arm() -> None:
    from rich.console import Console

    live = [_arm("x", {**_m(0.7, 100), "live": {"server_means": {"ttft_mean_s": 0.2}}})]
    live[0].runs[0].metrics["ttft_s"]["mean"] = 0.45
    doc = fidelity_document(live, [_arm("x", _m(0.7, 100))], [["x"]], {})
    assert doc["ttft_split"]["x"]["outside"] == pytest.approx(0.25)
    console = Console(record=True, width=200)
    print_fidelity(doc, console)
    assert "TTFT mean, ms: x: live 450 = vLLM 200 (queue -, prefill -) + outside vLLM 250" in (
        console.export_text()
    )


def test_the_split_says_how_long_the_live_client_stalled() -> None:
    from rich.console import Console

    loop = {"stalled_s": 3.25, "wall_s": 10.0}
    means = {"ttft_mean_s": 0.2}
    live = [_arm("x", {**_m(0.7, 100), "live": {"server_means": means, "client_loop": loop}})]
    doc = fidelity_document(live, [_arm("x", _m(0.7, 100))], [["x"]], {})
    t = doc["ttft_split"]["x"]
    assert (t["client_stalled_s"], t["client_wall_s"]) == (3.25, 10.0)
    console = Console(record=True, width=200)
    print_fidelity(doc, console)
    assert "the client's loop stalled 3.2 s of 10 s" in console.export_text()


def _tiny_model(tmp_path: Path) -> Path:
    d = tmp_path / "model"
    d.mkdir()
    config = {
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "hidden_size": 128,
        "torch_dtype": "float32",
    }
    (d / "config.json").write_text(json.dumps(config), "utf-8")
    return d


def test_vllm_kv_tokens_of_the_tiny_model(tmp_path: Path) -> None:
    model = _tiny_model(tmp_path)
    # 2 (K, V) * 2 layers * 2 heads * 64 * 4 bytes = 2 KiB per token
    assert vllm_kv_tokens(model, 64 * 2**20, 32) == 32768
    assert vllm_kv_tokens(model, 8 * 2**20, 32) == 4096
    with pytest.raises(ConfigError, match=r"config\.json"):
        vllm_kv_tokens(tmp_path, 2**20, 32)


def _settings(live: dict[str, Any], replicas: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "workload": {"kind": "toy", "options": {}},
        "replicas": {"block_size": 32, **(replicas or {})},
        "live": live,
    }


def test_live_engine_settings_never_silently_default(tmp_path: Path) -> None:
    assert live_engine_settings(_settings({})) is None  # emulated: the simulator's own
    model = _tiny_model(tmp_path)
    live = {"replicas": "command", "preset": "vllm-cpu", "model": str(model)}
    e = live_engine_settings(_settings({**live, "kv_cache_bytes": 16 * 2**20, "max_num_seqs": 8}))
    assert e is not None
    assert e.replicas_overrides() == {
        "kv_capacity_tokens": 8192,
        "max_num_seqs": 8,
        "max_model_len": 2048,
        "block_size": 32,
        "max_num_batched_tokens": 2048,
    }
    assert "config.json" in e.source
    explicit = _settings(live, {"kv_capacity_tokens": 1000, "max_num_seqs": 4})
    e = live_engine_settings(explicit)
    assert e is not None and e.replicas_overrides() == {}
    with pytest.raises(ConfigError, match="kv_capacity_tokens and max_num_seqs"):
        live_engine_settings(_settings({"replicas": "command", "replica_command": "x ${PORT}"}))


def test_profile_note_says_whether_calibrated(tmp_path: Path) -> None:
    note = profile_note(_settings({}))
    assert "NOT calibrated" in note and "not evidence" in note
    prof = tmp_path / "p.toml"
    prof.write_text(
        '[profiles.c]\nbase = "toy-8b-h100-tp1"\n[calibration]\nblock_size = 32\n'
        'date = "2026-12-06"\nservers = [{model = "tiny"}]\n',
        "utf-8",
    )
    note = profile_note(_settings({}, {"profile": str(prof)}))
    assert note.startswith("profile c: calibrated") and "tiny" in note


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sessionroute.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


def test_compare_on_a_live_file_simulates_the_servers_engine(tmp_path: Path) -> None:
    model = _tiny_model(tmp_path)
    exp = tmp_path / "exp.toml"
    exp.write_text(
        '[workload]\nkind = "toy"\n[replicas]\nblock_size = 32\n[live]\nreplicas = "command"\n'
        f'preset = "vllm-cpu"\nmodel = "{model}"\nkv_cache_bytes = 16777216\n'
        '[[arms]]\npolicy = "random"\n',
        "utf-8",
    )
    r = _cli("compare", str(exp), "--dry-run", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "simulating the [live] servers' engine: derived from" in r.stderr
    plan = json.loads(r.stdout)
    assert plan["replicas"]["kv_capacity_tokens"] == 8192
    assert plan["replicas"]["max_num_seqs"] == 16
    r = _cli("compare", str(exp), "--profile", "p.toml", cwd=tmp_path)
    assert r.returncode == 2 and "--profile goes with --fidelity" in r.stderr


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ((), "--calibrate-probe goes with --fidelity"),
        (("--fidelity", "--profile", "p.toml"), "--calibrate-probe calibrates: not with --profile"),
    ],
)
def test_calibrate_probe_is_refused_where_nothing_is_calibrated(
    extra: tuple[str, ...], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--calibrate-probe`` without ``--fidelity``, or beside a ``--profile`` (nothing is
    calibrated then), is an error, as ``--profile`` without ``--fidelity`` is; not ignored."""
    from sessionroute.cli import main

    argv = ["compare", "--calibrate-probe", "first", *extra, "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    assert message in capsys.readouterr().err
