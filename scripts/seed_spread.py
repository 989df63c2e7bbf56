"""Seed spread and ranking stability of a ``compare --repeats N`` run (``data/seed_spread.json``).

Usage::

    python scripts/seed_spread.py RUN_DIR [--metric step_time_s.mean]

RUN_DIR holds ``results.json`` and ``steps.csv`` of a compare with 2 or more repeats. Prints,
per metric, each arm's seed range as a fraction of its mean, ``(max - min) / mean``; the
paired spread: for each arm but the best on the metric, the range over seeds of its
seed-by-seed difference from the best, as a fraction of the best's value, and their median
(what ``relative_spread`` stores: how far the gap between two arms moves from seed to seed);
then, per seed, the ranking of the arms on the mean RL step time of their first k steps for
every k, and the smallest k from which the ranking (and the best arm) no longer changes up to
the run's last step.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

DIRECTION = {"output_tokens_per_s": 1, "slo_goodput": 1}
"""Metrics where higher is better (the others: lower)."""

METRICS = (
    "step_time_s.mean",
    "step_time_s.p50",
    "group_latency_s.p90",
    "rollouts_timed_out_share",
    "ttft_s.p99",
    "output_tokens_per_s",
    "slo_goodput",
)


def _get(d: Any, path: str) -> float | None:
    for part in path.split("."):
        if not isinstance(d, dict) or part not in d:
            return None
        d = d[part]
    return float(d) if isinstance(d, int | float) and not isinstance(d, bool) else None


def spreads(doc: dict[str, Any]) -> dict[str, tuple[float, dict[str, float]]]:
    """metric -> (largest relative range over arms, {arm: relative range})."""
    out: dict[str, tuple[float, dict[str, float]]] = {}
    for metric in METRICS:
        per_arm: dict[str, float] = {}
        for arm in doc["arms"]:
            vals = [_get(r["metrics"], metric) for r in arm["repeats"]]
            nums = [v for v in vals if v is not None]
            if len(nums) >= 2 and sum(nums) > 0:
                per_arm[arm["name"]] = (max(nums) - min(nums)) / (sum(nums) / len(nums))
        if per_arm:
            out[metric] = (max(per_arm.values()), per_arm)
    return out


def paired_spreads(doc: dict[str, Any]) -> dict[str, tuple[float, str, dict[str, float]]]:
    """metric -> (median paired relative range, the best arm, {arm: paired relative range})."""
    out: dict[str, tuple[float, str, dict[str, float]]] = {}
    for metric in METRICS:
        by_arm: dict[str, dict[int, float]] = {}
        for arm in doc["arms"]:
            got = {int(r["seed"]): _get(r["metrics"], metric) for r in arm["repeats"]}
            by_arm[arm["name"]] = {k: v for k, v in got.items() if v is not None}
        means = {a: sum(v.values()) / len(v) for a, v in by_arm.items() if v}
        if len(means) < 2:
            continue
        sign = DIRECTION.get(metric, -1)
        best = max(means, key=lambda a: sign * means[a])
        ranges: dict[str, float] = {}
        for arm, vals in by_arm.items():
            common = sorted(set(vals) & set(by_arm[best]))
            if arm == best or len(common) < 2:
                continue
            rel = [(vals[k] - by_arm[best][k]) / by_arm[best][k] for k in common if by_arm[best][k]]
            if len(rel) >= 2:
                ranges[arm] = max(rel) - min(rel)
        if ranges:
            out[metric] = (statistics.median(ranges.values()), best, ranges)
    return out


def stable_steps(steps_csv: Path) -> dict[int, tuple[int, int, int]]:
    """seed (repeat index) -> (steps, first k of a ranking that never changes after,
    first k of a best arm that never changes after)."""
    times: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    with steps_csv.open() as fh:
        for row in csv.DictReader(fh):
            times[int(row["repeat"])][row["arm"]].append(float(row["step_time_s"]))
    out: dict[int, tuple[int, int, int]] = {}
    for rep, arms in times.items():
        n = min(len(v) for v in arms.values())
        rankings = []
        for k in range(1, n + 1):
            means = {a: sum(v[:k]) / k for a, v in arms.items()}
            rankings.append(tuple(sorted(means, key=lambda a: means[a])))
        full = next(k for k in range(1, n + 1) if all(r == rankings[-1] for r in rankings[k - 1 :]))
        best = next(
            k for k in range(1, n + 1) if all(r[0] == rankings[-1][0] for r in rankings[k - 1 :])
        )
        out[rep] = (n, full, best)
        print(f"repeat {rep}: final ranking {' < '.join(rankings[-1])}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    args = parser.parse_args()
    doc = json.loads((args.run_dir / "results.json").read_text())
    for metric, (largest, per_arm) in spreads(doc).items():
        shown = ", ".join(f"{a} {v * 100:.1f} %" for a, v in per_arm.items())
        print(f"{metric}: own seed range, largest {largest * 100:.2f} % ({shown})")
    for metric, (median, best, ranges) in paired_spreads(doc).items():
        shown = ", ".join(f"{a} {v * 100:.2f} %" for a, v in ranges.items())
        print(f"{metric}: paired spread vs {best}, median {median * 100:.2f} % ({shown})")
    for rep, (n, full, first) in sorted(stable_steps(args.run_dir / "steps.csv").items()):
        print(f"repeat {rep}: {n} steps; ranking fixed from step {full}, best arm from {first}")


if __name__ == "__main__":
    main()
