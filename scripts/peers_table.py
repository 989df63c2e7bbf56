"""The docs/policies.md measurement table of the peer policies from ``compare`` results.

Usage::

    python scripts/peers_table.py RUN_DIR [RUN_DIR ...]

Each RUN_DIR is the ``--out`` of one ``sessionroute compare examples/peers.toml`` run (one
regime, one seed; ``SEED``, ``INFLIGHT`` and ``REPLICAS`` set in the environment). Runs are
grouped by regime (rollouts in flight, replicas); every metric is the mean over the seeds
found, with the spread as min..max, and the seeds listed. Metrics: output tokens per simulated
second, step time p50 and max (seconds), rollouts cancelled by the workload's timeout, and the
lowest per-replica prefix-cache hit rate.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any


def _row(metrics: dict[str, Any]) -> dict[str, float]:
    steps = metrics["step_time_s"]
    return {
        "out_tok_s": float(metrics["output_tokens_per_s"]),
        "step_p50": float(steps["p50"]),
        "step_max": float(steps["max"]),
        "timeouts": float(metrics["workload"].get("rollouts_timeout", 0)),
        "worst_hit": min(float(r["hit_rate"]) for r in metrics["per_replica"]),
    }


def _fmt(values: list[float], digits: int) -> str:
    mean = statistics.fmean(values)
    if len(values) == 1:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ({min(values):.{digits}f}..{max(values):.{digits}f})"


def main(dirs: list[str]) -> None:
    table: dict[tuple[int, int], dict[str, list[dict[str, float]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    seeds: dict[tuple[int, int], set[int]] = defaultdict(set)
    order: list[str] = []
    for d in dirs:
        doc = json.loads((Path(d) / "results.json").read_text())
        exp = doc["experiment"]
        inflight = exp["workload"]["options"].get("inflight_rollouts") or 544
        regime = (int(inflight), int(exp["replicas"]["count"]))
        for arm in doc["arms"]:
            if arm["name"] not in order:
                order.append(arm["name"])
            for rep in arm["repeats"]:
                table[regime][arm["name"]].append(_row(rep["metrics"]))
                seeds[regime].add(int(rep["seed"]))
    for regime in sorted(table):
        inflight, replicas = regime
        print(
            f"\n{inflight} rollouts in flight, {replicas} replicas, seeds {sorted(seeds[regime])}\n"
        )
        print(
            "| policy | output tok/s | step p50 (s) | step max (s) | timeouts | worst-replica hit |"
        )
        print("|---|---|---|---|---|---|")
        for name in order:
            rows = table[regime].get(name)
            if not rows:
                continue
            cols = [
                _fmt([r["out_tok_s"] for r in rows], 0),
                _fmt([r["step_p50"] for r in rows], 1),
                _fmt([r["step_max"] for r in rows], 1),
                _fmt([r["timeouts"] for r in rows], 0),
                _fmt([r["worst_hit"] for r in rows], 3),
            ]
            print(f"| `{name}` | " + " | ".join(cols) + " |")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
