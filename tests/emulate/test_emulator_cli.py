"""``sessionroute emulate`` as a user runs it: prints URLs, serves, stops on SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys

import httpx
import pytest

from sessionroute.cli import build_parser, main
from sessionroute.cli.emulate import settings_from_args

CMD = [sys.executable, "-m", "sessionroute.cli", "emulate"]


def test_emulate_prints_urls_serves_and_stops_on_sigterm() -> None:
    proc = subprocess.Popen(
        [*CMD, "--replicas", "3", "--port", "0", "--time-scale", "100", "--model", "tiny"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        if proc.stdout is None:
            raise AssertionError("no stdout pipe")
        urls = [proc.stdout.readline().strip() for _ in range(3)]
        assert all(u.startswith("http://127.0.0.1:") for u in urls) and len(set(urls)) == 3
        with httpx.Client(timeout=10) as client:
            for url in urls:
                r = client.post(
                    url + "/v1/chat/completions",
                    json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
                )
                assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 16
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--replicas", "0"], "--replicas"),
        (["--profile", "nope"], "unknown profile"),
        (["--time-scale", "0"], "time_scale"),
        (["--profile-file", "/nonexistent.toml"], "nonexistent"),
    ],
)
def test_emulate_rejects_bad_flags(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["emulate", *flags]) == 2
    assert message in capsys.readouterr().err


def test_flags_map_to_settings() -> None:
    args = build_parser().parse_args(
        [
            "emulate",
            "--profile",
            "glm45air-h200-tp8",
            "--time-scale",
            "10",
            "--kv-capacity-tokens",
            "65536",
            "--block-size",
            "32",
            "--max-model-len",
            "8192",
            "--stream-interval-ms",
            "2",
        ]
    )
    s = settings_from_args(args)
    assert s.served_model == "glm45air-h200-tp8" and s.time_scale == 10.0
    assert s.replica_config().num_blocks == 2048
    assert s.port == 8100 and s.stream_interval_s == 0.002
