"""The regime grid of issue 37: is a policy within 2 % of the best other arm everywhere?

For swe-rl at 3, 4 and 5 replicas, it sweeps rollouts in flight from 0.8x to 1.5x the knee
(taken as 544 rollouts per 3 replicas, the default experiment's, scaled with the replica
count; each sweep also reports the knee it finds); for the trace replays, Weka at 64, 96, 128
and 160 sessions at once and Mooncake at 1.5x, 2x, 3x and 4x its recorded arrival rate. Each
is judged on its workload's declared objective (docs/objectives.md), seeds 0..SEEDS-1. One
row per load point: the policy's mean objective, the best other arm's (among those meeting the
constraints), the gap, and on the replays the TTFT p99 ratio against that arm. A point passes
at a gap <= 2 % (and, on the replays, a TTFT p99 ratio <= 1.5).

    python scripts/hold_grid.py --out runs/hold-grid [--seeds 3] [--jobs 2] [--only swe3]
    python scripts/hold_grid.py --out runs/hold-grid --summary   # the table from finished runs
    python scripts/hold_grid.py --out runs/hold-grid2 --against runs/hold-grid --only weka
        # after a change to the policy: rerun only --policy, take the other arms from the
        # earlier grid (sessionroute sweep --merge; refused unless it ran the same sweep)

The arms: the policy, the built-in session-affine and load-aware ones and the peers'
(POLICIES.md), without the load-only ones (round_robin, random, power_of_two, least_loaded),
which trail by 30 % or more on every RL point measured so far (swe544.toml, peers.toml).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ARMS = [
    "adaptive_hold",
    "adaptive_sticky",
    "consistent_hash",
    "sticky_least_loaded",
    "consistent_hash_bounded_load(c=1.25)",
    "consistent_hash_bounded_load(c=1.05)",
    "cache_aware",
    "cache_aware_v2",
    "sticky_until_saturated",
    "least_token_load",
    "kv_cost",
]
KNEE_PER_REPLICA = 544 / 3
LOADS = (0.8, 1.0, 1.25, 1.5)

_RL = """name = "grid-swe-r{r}"
description = "swe-rl on {r} replicas (issue 37 grid)"
[workload]
kind = "swe-rl"
steps = 20
[replicas]
count = {r}
profile = "glm45air-h200-tp8"
[router]
finish_sessions = true
[[arms]]
policy = "adaptive_hold"
"""


def _regimes(root: Path) -> dict[str, list[str]]:
    """name -> the sweep command line (without --out, --seeds, --jobs, --policies)."""
    regimes: dict[str, list[str]] = {}
    for r in (3, 4, 5):
        path = root / f"swe-r{r}.toml"
        path.write_text(_RL.format(r=r))
        values = ",".join(str(round(k * KNEE_PER_REPLICA * r)) for k in LOADS)
        regimes[f"swe{r}"] = [str(path), "--knob", "inflight", "--values", values]
    examples = Path(__file__).resolve().parent.parent / "examples" / "regimes"
    weka = str(examples / "weka96.toml")
    regimes["weka"] = [weka, "--knob", "concurrency", "--values", "64,96,128,160"]
    moon = str(examples / "mooncake.toml")
    regimes["mooncake"] = [moon, "--knob", "time-scale", "--values", "0.67,0.5,0.33,0.25"]
    return regimes


def _summary(root: Path, name: str, policy: str) -> list[dict[str, Any]]:
    data = json.loads((root / name / "sweep.json").read_text())
    serving = "goodput" in data["objective"]["metric"]
    rows = []
    for point in data["verdict_details"]:
        arms = {a["name"]: a for a in point["arms"]}
        mine = arms.get(policy)
        rest = [a for n, a in arms.items() if n != policy]
        others = [a for a in rest if a["meets_constraints"]]
        if mine is None or not rest:
            continue
        # no other arm meets the constraints: against the best other on the objective alone
        others = others or rest
        sign = -1 if point["objective"]["direction"] == "max" else 1
        best = min(others, key=lambda a: sign * a["objective"])
        gap = sign * (mine["objective"] - best["objective"]) / abs(best["objective"])
        row: dict[str, Any] = {
            "regime": name,
            "value": point["value"],
            "policy": mine["objective"],
            "best_other": best["name"],
            "best_value": best["objective"],
            "gap": gap,
            "meets": mine["meets_constraints"],
            "others_meet": best["meets_constraints"],
        }
        ok = gap <= 0.02 and (bool(mine["meets_constraints"]) or not best["meets_constraints"])
        if serving:
            ttft = {
                p["policy"]: p["metrics"]["ttft_s.p99"]["mean"]
                for p in data["points"]
                if p["value"] == point["value"]
            }
            ratio = ttft[policy] / ttft[best["name"]]
            row["ttft_p99_ratio"] = ratio
            ok = ok and ratio <= 1.5
        row["pass"] = ok
        rows.append(row)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument(
        "--only", action="append", help="regime names (swe3, swe4, swe5, weka, mooncake)"
    )
    ap.add_argument("--policy", default="adaptive_hold")
    ap.add_argument("--summary", action="store_true", help="only print the table")
    ap.add_argument(
        "--against",
        type=Path,
        metavar="DIR",
        help="an earlier grid's --out: run only --policy and merge the other arms from DIR",
    )
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    regimes = _regimes(args.out)
    names = args.only or list(regimes)
    if not args.summary:
        for name in names:
            if (args.out / name / "sweep.json").exists():
                continue
            cmd = [sys.executable, "-m", "sessionroute.cli", "sweep", *regimes[name]]
            arms = [args.policy] if args.against else ARMS
            cmd += ["--policies", ",".join(arms), "--seeds", str(args.seeds)]
            if args.against:
                cmd += ["--merge", str(args.against / name)]
            cmd += ["--jobs", str(args.jobs), "--out", str(args.out / name)]
            print("+", " ".join(cmd), flush=True)
            subprocess.run(cmd, check=True)
    rows = [
        r
        for n in names
        if (args.out / n / "sweep.json").exists()
        for r in _summary(args.out, n, args.policy)
    ]
    print(
        f"{'regime':9} {'load':>6} {args.policy:>14} {'best other':>38} {'gap':>7}",
        f"{'TTFTp99x':>8} pass",
    )
    for r in rows:
        ratio = f"{r['ttft_p99_ratio']:.2f}" if "ttft_p99_ratio" in r else "-"
        if not r["meets"]:
            others = "" if r["others_meet"] else "; so does every other arm"
            note = f" (breaks a constraint{others})"
        elif not r["others_meet"]:
            note = " (no other arm meets the constraints)"
        else:
            note = ""
        print(
            f"{r['regime']:9} {r['value']:>6} {r['policy']:>14.4g} "
            f"{r['best_other'] + ' ' + format(r['best_value'], '.4g'):>38} "
            f"{100 * r['gap']:>+6.1f}% {ratio:>8} {'yes' if r['pass'] else 'NO'}{note}"
        )
    (args.out / "grid.json").write_text(json.dumps(rows, indent=1))
    return 0 if rows and all(r["pass"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
