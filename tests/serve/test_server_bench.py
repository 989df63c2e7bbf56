"""``sessionroute bench proxy`` runs end to end (tiny duration; numbers are not asserted)."""

from __future__ import annotations

import argparse

from sessionroute.bench import proxy


def test_bench_proxy_smoke() -> None:
    parser = argparse.ArgumentParser()
    proxy.add_arguments(parser)
    args = parser.parse_args(
        [
            "--duration",
            "0.3",
            "--concurrency",
            "2",
            "--body-bytes",
            "0",
            "--targets",
            "direct",
            "sessionroute",
            "--repeat",
            "2",
        ]
    )
    result = proxy.run(args)
    rows = {r["target"]: r for r in result["rows"]}
    assert set(rows) == {"direct", "sessionroute"}
    assert all(r["errors"] == 0 and r["requests"] > 0 for r in rows.values())
    assert all(r["repeats"] == 2 for r in rows.values())
    assert rows["direct"]["router_cpu_us_per_req"] is None
    assert rows["sessionroute"]["router_cpu_us_per_req"] > 0
    assert rows["direct"]["backend_cpu_us_per_req"] > 0
    assert "added_p50_ms" in rows["sessionroute"]
    proxy.print_table(result)
