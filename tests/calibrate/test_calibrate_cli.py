"""``sessionroute calibrate`` against real loopback servers: errors, --dry-run, a whole run."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from aiohttp import web

from sessionroute.cli import main
from sessionroute.replica import load_profile_file

from .fake_vllm import FakeVllm, serving


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_server_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{_free_port()}"
    assert main(["calibrate", "--url", url, "--timeout", "5"]) == 1
    err = capsys.readouterr().err
    assert "cannot reach" in err and url in err


def test_plain_http_server_is_not_vllm(capsys: pytest.CaptureFixture[str]) -> None:
    with serving(web.Application()) as url:  # answers 404 to everything
        assert main(["calibrate", "--url", url]) == 1
    err = capsys.readouterr().err
    assert "is not a vLLM server" in err and "404" in err


def test_dry_run_prints_the_plan_and_sends_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    fake = FakeVllm()
    out = tmp_path / "p.toml"
    with serving(fake.app()) as url:
        assert main(["calibrate", "--url", url, "--dry-run", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "probe plan" in text and "prefill L=" in text and "decode B=4" in text
    assert "churn c=4" in text and "nothing sent" in text
    assert fake.posts == [] and fake.requests == 0
    assert not out.exists()


def test_hidden_batch_limits_need_the_flags(capsys: pytest.CaptureFixture[str]) -> None:
    fake = FakeVllm(expose_limits=False)
    with serving(fake.app()) as url:
        assert main(["calibrate", "--url", url, "--dry-run"]) == 1
        assert "--max-num-seqs" in capsys.readouterr().err
        args = ["--max-num-seqs", "8", "--max-num-batched-tokens", "256"]
        assert main(["calibrate", "--url", url, "--dry-run", *args]) == 0
    text = capsys.readouterr().out
    assert "flags" in text and "decode B=8" in text


def test_whole_run_writes_a_profile_that_loads(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    fake = FakeVllm()
    out = tmp_path / "profile.toml"
    with serving(fake.app()) as url:
        argv = ["calibrate", "--url", url, "--out", str(out), "--reps", "1"]
        assert main([*argv, "--decode-tokens", "4"]) == 0
    text = capsys.readouterr().out
    assert "fitted step-time constants" in text and "b_req_s" in text
    assert "/reset_prefix_cache" in fake.posts and fake.requests > 10
    pf = load_profile_file(out)
    assert pf.block_size == 16
    assert pf.profile.name == "calibrated-fake"
    assert pf.profile.kv_capacity_tokens == 511 * 16  # vLLM keeps one block as its null block
    assert (pf.profile.max_num_seqs, pf.profile.max_num_batched_tokens) == (4, 512)
    assert pf.profile.max_model_len == 1024
    assert pf.calibration["servers"][0]["url"] == url
    assert pf.calibration["servers"][0]["vllm_version"] == "0.0-fake"
    assert set(pf.calibration["fit_error"]) == {
        "b0_s",
        "b_tok_s",
        "b_seq_s",
        "b_req_s",
        "b_kv_s",
        "b_pa_s",
    }


def test_no_stream_fits_the_servers_histograms(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    fake = FakeVllm()
    out = tmp_path / "profile.toml"
    with serving(fake.app()) as url:
        argv = ["calibrate", "--url", url, "--out", str(out), "--reps", "1", "--no-stream"]
        assert main([*argv, "--decode-tokens", "4"]) == 0
    text = capsys.readouterr().out
    assert "vllm:time_to_first_token_seconds" in text
    assert "vllm:request_decode_time_seconds" in text
    phases = load_profile_file(out).calibration["phases"]
    assert {p["measured"] for p in phases} >= {"vllm:time_to_first_token_seconds"}


def test_probe_together_sends_each_round_to_every_server_at_once(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    log: list[str] = []
    fakes = [FakeVllm(log=log, name=n) for n in ("a", "b")]
    out = tmp_path / "profile.toml"
    with serving(fakes[0].app()) as url_a, serving(fakes[1].app()) as url_b:
        argv = ["calibrate", "--url", url_a, "--url", url_b, "--out", str(out), "--reps", "2"]
        assert main([*argv, "--decode-tokens", "4", "--probe", "together"]) == 0
    text = capsys.readouterr().out
    assert "2 servers probed at once, in lockstep" in text
    assert all(f.requests > 10 for f in fakes)
    # lockstep: every round resets both caches before either server's next round starts
    resets = [entry.split()[0] for entry in log]
    assert len(resets) > 4
    assert all(set(resets[i : i + 2]) == {"a", "b"} for i in range(0, len(resets), 2))
    cal = load_profile_file(out).calibration
    assert cal["probe"] == "together"
    assert [s["url"] for s in cal["servers"]] == [url_a, url_b]
    assert {p["phase"] for p in cal["phases"]} and len(cal["phases"]) % 2 == 0


def test_probe_all_probes_the_servers_one_after_the_other(tmp_path: Path) -> None:
    log: list[str] = []
    fakes = [FakeVllm(log=log, name=n) for n in ("a", "b")]
    out = tmp_path / "profile.toml"
    with serving(fakes[0].app()) as url_a, serving(fakes[1].app()) as url_b:
        argv = ["calibrate", "--url", url_a, "--url", url_b, "--out", str(out), "--reps", "2"]
        assert main([*argv, "--decode-tokens", "4"]) == 0
    resets = [entry.split()[0] for entry in log]
    first_b = resets.index("b", 2)  # after the two reads of whether a server can reset
    assert set(resets[2:first_b]) == {"a"} and set(resets[first_b:]) == {"b"}
    assert load_profile_file(out).calibration["probe"] == "all"
