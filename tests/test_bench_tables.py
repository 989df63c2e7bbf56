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
    rows: list[dict[str, object]] = [
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
    rows[0] |= {"cpu_vs_vllm_router": 0.684, "cpu_vs_vllm_router_range": [0.61, 0.73]}
    python = {"version": "3.11.7", "executable": "/x/.venv/bin/python", "libpython_shared": True}
    print_table(
        {
            "duration_s": 10,
            "repeat": 3,
            "policy": "consistent_hash",
            "rows": rows,
            "python": python,
        }
    )
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80, out
    assert "…" not in out, out
    assert "sessionroute  204882" in out and "109.81" in out
    assert "sessionroute 87 B x 64: 0.68 (0.61-0.73)" in " ".join(out.split())
    assert "Python 3.11.7, libpython shared (/x/.venv/bin/python)" in " ".join(out.split())


def test_bench_proxy_ratio_to_vllm_router_pairs_the_cycles() -> None:
    """The ratio is taken cycle by cycle (the same minutes of load), then its median: not the
    ratio of two medians taken from different cycles."""
    from sessionroute.bench.proxy import _median_rows, to_markdown

    def raw(target: str, cpu: float | None) -> dict[str, object]:
        return {
            "target": target,
            "body_bytes": 87,
            "concurrency": 1,
            "rps": 1000.0,
            "p50_ms": 1.0,
            "p99_ms": 2.0,
            "router_cpu_us_per_req": cpu,
            "router_user_us_per_req": None if cpu is None else cpu * 0.6,
            "router_sys_us_per_req": None if cpu is None else cpu * 0.4,
            "backend_cpu_us_per_req": 100.0,
            "requests": 10,
            "errors": 0,
        }

    cycles = [(200.0, 400.0, None), (300.0, 300.0, None), (250.0, 500.0, None)]
    rows = _median_rows(
        [
            r
            for s, v, d in cycles
            for r in (raw("sessionroute", s), raw("vllm-router", v), raw("direct", d))
        ]
    )
    by = {r["target"]: r for r in rows}
    assert by["sessionroute"]["cpu_vs_vllm_router"] == 0.5  # ratios 0.5, 1.0, 0.5
    assert by["sessionroute"]["cpu_vs_vllm_router_range"] == [0.5, 1.0]
    assert 250.0 / 400.0 != 0.5  # (the ratio of the medians would say 0.62)
    assert (
        "cpu_vs_vllm_router" not in by["vllm-router"] and "cpu_vs_vllm_router" not in by["direct"]
    )
    assert by["sessionroute"]["router_user_us_per_req"] == 150.0  # median of 120, 180, 150
    assert by["sessionroute"]["router_sys_us_per_req"] == 100.0
    assert by["direct"]["router_user_us_per_req"] is None
    assert "| 250 | 150 | 100 | 0.50 (0.50-1.00) |" in to_markdown({"rows": rows})
