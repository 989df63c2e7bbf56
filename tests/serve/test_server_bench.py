"""``sessionroute bench proxy`` runs end to end (tiny duration; numbers are not asserted)."""

from __future__ import annotations

import argparse
import platform

from sessionroute.bench import proxy, shared

from .redis_server import RedisServer


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
            "floor",
            "--repeat",
            "2",
        ]
    )
    result = proxy.run(args)
    rows = {r["target"]: r for r in result["rows"]}
    assert set(rows) == {"direct", "sessionroute", "floor"}  # the floor relays without error
    assert all(r["errors"] == 0 and r["requests"] > 0 for r in rows.values())
    assert all(r["repeats"] == 2 for r in rows.values())
    assert rows["direct"]["router_cpu_us_per_req"] is None
    assert rows["sessionroute"]["router_cpu_us_per_req"] > 0
    assert rows["floor"]["router_cpu_us_per_req"] > 0
    for target in ("sessionroute", "floor"):  # user and kernel time, each a median of its own
        assert rows[target]["router_user_us_per_req"] >= 0
        assert rows[target]["router_sys_us_per_req"] >= 0
    assert rows["direct"]["router_user_us_per_req"] is None
    assert rows["direct"]["backend_cpu_us_per_req"] > 0
    assert result["python"]["version"] == platform.python_version()
    assert result["python"]["libpython_shared"] in (True, False)  # read from /proc/self/maps
    assert "added_p50_ms" in rows["sessionroute"]
    proxy.print_table(result)


def test_bench_proxy_with_redis_adds_a_row_and_bench_shared_state_finds_no_mismatch(
    redis_server: RedisServer,
) -> None:
    parser = argparse.ArgumentParser()
    proxy.add_arguments(parser)
    args = parser.parse_args(
        [
            *("--duration", "0.3", "--concurrency", "2", "--body-bytes", "0", "--targets"),
            *("direct", "--state-url", redis_server.url, "--policy", "sticky_least_loaded"),
        ]
    )
    result = proxy.run(args)
    rows = {r["target"]: r for r in result["rows"]}
    assert set(rows) == {"direct", "sessionroute", "sessionroute+redis"}
    assert rows["sessionroute+redis"]["errors"] == 0 and rows["sessionroute+redis"]["requests"] > 0

    parser = argparse.ArgumentParser()
    shared.add_arguments(parser)
    base = ["--sessions", "30", "--turns", "3", "--workers", "3"]
    result = shared.run(parser.parse_args([*base, "--state-url", redis_server.url, "--restart"]))
    assert (result["failed"], result["mismatches"], result["sessions_replaced"]) == (0, 0, 0)
    assert result["sessions_per_worker"] == [10, 10, 10]
    assert shared.exit_status(result) == 0
