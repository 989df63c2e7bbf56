"""The benchmark tables read on an 80-column terminal (tiny sizes, not timed)."""

from __future__ import annotations

import pytest

from sessionroute.cli import main


def test_bench_engine_table_fits_80_columns(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "engine", "--sessions", "4", "--max-context", "8000", "--block-size", "64"]
    assert main([*argv, "--requests", "20", "--reference-requests", "10"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80, out
    ratio_row = next(line for line in lines if "requests / wall second" in line)
    assert ratio_row.rstrip(" │").endswith("x"), ratio_row  # fast / reference ratio shown
    assert "fast" in out and "reference" in out


def test_bench_proxy_table_fits_80_columns_without_cutting_cells(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from sessionroute.bench.proxy import print_table

    monkeypatch.setenv("COLUMNS", "80")
    rows = [
        {
            "target": target,
            "body_bytes": body,
            "concurrency": 64,
            "rps": 3375.2,
            "p50_ms": 18.22,
            "p99_ms": 109.812,
            "added_p50_ms": 20.21,
            "router_cpu_us_per_req": 1155.3,
            "backend_cpu_us_per_req": 544.0,
        }
        for target in ("sessionroute", "vllm-router")
        for body in (87, 204882)
    ]
    print_table({"duration_s": 10, "repeat": 3, "policy": "consistent_hash", "rows": rows})
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80, out
    assert "…" not in out, out
    assert "sessionroute  204882" in out and "109.81" in out
