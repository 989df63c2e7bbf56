#!/usr/bin/env python3
"""Assert a ``compare --fidelity`` run (its ``fidelity.json``) for CI.

Fails (exit 1) when any check of the run failed (issue 35's bounds per arm, the arm order
beyond the live spread, preemptions on both sides or neither), and, for the arms named
``*<pressure suffix>``, when the pressure did not reach the servers: no preemption in some
live run, or a live hit rate not below the infinite-cache bound (``ideal_hit_rate``, from the
``results.json`` beside it) by at least ``--min-eviction`` (what LRU eviction costs a sticky
arm). Prints every check. Standard library only.

Usage: ``check_fidelity.py OUT/fidelity.json [--pressure-suffix=-pressure]
[--min-eviction 0.02]``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("fidelity", type=Path)
    parser.add_argument("--pressure-suffix", default="-pressure")
    parser.add_argument("--min-eviction", type=float, default=0.02)
    args = parser.parse_args()
    doc = json.loads(args.fidelity.read_text(encoding="utf-8"))
    results = json.loads((args.fidelity.parent / "results.json").read_text(encoding="utf-8"))
    live = {a["name"]: a for a in results["arms"]}
    failed = []
    for c in doc["checks"]:
        print(f"{'ok  ' if c['ok'] else 'FAIL'} {c['what']}: {c['detail']}")
        if not c["ok"]:
            failed.append(c["what"])
    for name, cmp in doc["arms"].items():
        if not name.endswith(args.pressure_suffix):
            continue
        pre = cmp["preemptions"]["live"]
        ok = bool(pre) and min(pre) > 0
        print(f"{'ok  ' if ok else 'FAIL'} {name}: live preemptions {pre} (> 0 in every run)")
        if not ok:
            failed.append(f"{name}: preemptions")
        if name.startswith("sticky"):
            ideal = live[name]["metrics"].get("ideal_hit_rate")
            hit = cmp["hit_rate"]["live_mean"]
            ok = ideal is not None and hit is not None and hit <= ideal - args.min_eviction
            print(
                f"{'ok  ' if ok else 'FAIL'} {name}: live hit rate {hit} vs infinite-cache "
                f"{ideal} (eviction: at least {args.min_eviction} below)"
            )
            if not ok:
                failed.append(f"{name}: eviction")
    if failed:
        print(f"fidelity: FAIL: {len(failed)} checks: {', '.join(failed)}")
        return 1
    print("fidelity: every check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
