"""The docs/policies.md measurement tables of the policies from ``compare`` results.

Usage::

    python scripts/peers_table.py ROOT               # per-arm layout (below)
    python scripts/peers_table.py RUN_DIR [RUN_DIR ...]   # whole compare runs

ROOT holds one directory per regime, one per seed in it and one per arm in that, each with the
``results.json`` of a one-arm ``sessionroute compare``::

    ROOT/<regime>/s<seed>/<arm>/results.json       e.g. /work/runs/out/swe544/s0/kv_cost/

where ``<regime>`` is a stem of ``examples/regimes/*.toml`` (swe544, swe448, swe640, swe544r2,
weka96, mooncake; those come first in that order, any other after them, by name). A directory
without ``results.json`` (a run still going) is skipped. A RUN_DIR instead holds the
``results.json`` of a whole ``sessionroute compare examples/peers.toml --out RUN_DIR`` (one
seed, every arm; ``SEED``, ``INFLIGHT`` and ``REPLICAS`` set in the environment); such runs
are grouped into regimes by rollouts in flight and replicas. Both kinds may be mixed.

One markdown table per regime: every metric is the mean over the seeds found, with the spread
as min..max when there are several; the seeds are listed above it. Metrics: output tokens per
simulated second; for trace replays (``trace:*`` workloads, e.g. weka96, which compares them)
also the simulated seconds to replay the trace (``simulated_seconds``, lower is better); RL
step time p50 and max (seconds); rollouts timed out (the last three "n/a" for trace replays,
which have no RL steps); the lowest per-replica prefix-cache hit rate.
"""

from __future__ import annotations

import json
import statistics
import sys
import tomllib
from collections import defaultdict
from pathlib import Path
from typing import Any

REGIMES = ("swe544", "swe448", "swe640", "swe544r2", "weka96", "mooncake")
"""Regime directories in the order their tables are printed (examples/regimes/*.toml)."""


def _arm_order() -> list[str]:
    """Arm names in ``examples/peers.toml``'s order (rows are printed in it; other arms after,
    in the order first seen)."""
    path = Path(__file__).resolve().parents[1] / "examples" / "peers.toml"
    try:
        arms = tomllib.loads(path.read_text())["arms"]
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return []
    return [str(a.get("name") or a["policy"]) for a in arms]


def _row(metrics: dict[str, Any]) -> dict[str, float | None]:
    """The table's metrics of one run (None: not applicable)."""
    steps = metrics.get("step_time_s") or {}
    has_steps = bool(steps.get("count"))
    timeouts = metrics.get("rollouts_timed_out")
    if timeouts is None:
        timeouts = (metrics.get("workload") or {}).get("rollouts_timeout")
    return {
        "out_tok_s": float(metrics["output_tokens_per_s"]),
        "sim_s": float(metrics["simulated_seconds"]),
        "step_p50": float(steps["p50"]) if has_steps else None,
        "step_max": float(steps["max"]) if has_steps else None,
        "timeouts": float(timeouts) if timeouts is not None and has_steps else None,
        "worst_hit": min(float(r["hit_rate"]) for r in metrics["per_replica"]),
    }


def _fmt(values: list[float | None], digits: int) -> str:
    """Mean (min..max) of ``values``; "n/a" when none applies."""
    xs = [v for v in values if v is not None]
    if not xs:
        return "n/a"
    mean = statistics.fmean(xs)
    if len(xs) == 1:
        return f"{mean:,.{digits}f}"
    return f"{mean:,.{digits}f} ({min(xs):,.{digits}f}..{max(xs):,.{digits}f})"


class Tables:
    """Runs grouped by regime and arm, in the order arms were first seen."""

    def __init__(self) -> None:
        self.rows: dict[str, dict[str, list[dict[str, float | None]]]] = defaultdict(
            lambda: defaultdict(list)
        )
        self.arm_seeds: dict[tuple[str, str], list[int]] = defaultdict(list)
        self.seeds: dict[str, set[int]] = defaultdict(set)
        self.trace: dict[str, bool] = {}
        self.order: list[str] = []

    def add(self, regime: str, doc: dict[str, Any], seed: int | None = None) -> None:
        """Add every arm and repeat of one ``results.json`` document to ``regime``."""
        kind = str(doc["experiment"]["workload"].get("kind", ""))
        self.trace[regime] = kind.startswith("trace")
        for arm in doc["arms"]:
            if arm["name"] not in self.order:
                self.order.append(arm["name"])
            for rep in arm["repeats"]:
                self.rows[regime][arm["name"]].append(_row(rep["metrics"]))
                s = int(rep["seed"]) if seed is None else seed
                self.seeds[regime].add(s)
                self.arm_seeds[(regime, arm["name"])].append(s)

    def regimes(self) -> list[str]:
        known = [r for r in REGIMES if r in self.rows]
        return known + sorted(r for r in self.rows if r not in REGIMES)

    def print(self) -> None:
        for regime in self.regimes():
            trace = self.trace[regime]
            print(f"\n{regime}, seeds {sorted(self.seeds[regime])}\n")
            head = ["policy", "seeds", "output tok/s"]
            if trace:
                head.append("sim seconds (lower is better)")
            head += ["step p50 (s)", "step max (s)", "timeouts", "worst-replica hit"]
            print("| " + " | ".join(head) + " |")
            print("|" + "---|" * len(head))
            canon = _arm_order()
            rank = {n: i for i, n in enumerate(canon)}
            names = sorted(self.order, key=lambda n: (rank.get(n, len(canon)), self.order.index(n)))
            for name in names:
                rows = self.rows[regime].get(name)
                if not rows:
                    continue
                seeds = ",".join(map(str, sorted(self.arm_seeds[(regime, name)])))
                cols = [seeds, _fmt([r["out_tok_s"] for r in rows], 0)]
                if trace:
                    cols.append(_fmt([r["sim_s"] for r in rows], 0))
                cols += [
                    _fmt([r["step_p50"] for r in rows], 1),
                    _fmt([r["step_max"] for r in rows], 1),
                    _fmt([r["timeouts"] for r in rows], 0),
                    _fmt([r["worst_hit"] for r in rows], 3),
                ]
                print(f"| `{name}` | " + " | ".join(cols) + " |")


def _run_regime(doc: dict[str, Any]) -> str:
    """A whole compare run's regime label: rollouts in flight and replicas."""
    exp = doc["experiment"]
    inflight = exp["workload"]["options"].get("inflight_rollouts") or 544
    return f"{int(inflight)} rollouts in flight, {int(exp['replicas']['count'])} replicas"


def _seed_of(name: str) -> int | None:
    """The seed of a ``s<seed>`` directory name, or None."""
    return int(name[1:]) if name.startswith("s") and name[1:].isdigit() else None


def main(paths: list[str]) -> None:
    tables = Tables()
    for p in map(Path, paths):
        whole = p / "results.json"
        if whole.is_file():
            doc = json.loads(whole.read_text())
            tables.add(_run_regime(doc), doc)
            continue
        for f in sorted(p.glob("*/s*/*/results.json")):
            seed = _seed_of(f.parent.parent.name)
            if seed is None:
                continue
            tables.add(f.parent.parent.parent.name, json.loads(f.read_text()), seed)
    tables.print()


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
