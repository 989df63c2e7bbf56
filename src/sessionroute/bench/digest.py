"""``sessionroute bench digest``: prove a speed change leaves results byte-identical.

Each case (every policy on 3 swe-rl steps; faults; block sizes 1, 16 and 64; a small KV cache;
the toy workload; 3,000 Mooncake requests; 600 s of the Weka replay; four ``bench engine``
loads) runs with a pinned wall clock, and the JSON of its metrics, time series, RL steps and
samples (wall-clock keys removed) is hashed::

    sessionroute bench digest save before.json      # on the old code
    sessionroute bench digest check before.json     # on the new: exit status 1 on a change
    sessionroute bench digest check before.json engine toy   # only cases naming a fragment

About 3.5 minutes for all cases on a 2-core machine. Trace cases replay the traces shipped
with the package; a trace that cannot be loaded records its error, which then must match too.
The file is
``{case: [digest, finished requests]}``, the format ``benchmarks/results_digest.py`` wrote
before this command replaced it (for a commit older than the command, run that script from
the old commit: ``git show OLD:benchmarks/results_digest.py``). ``--json`` prints
``{"mode", "file", "cases", "different", "missing"}``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["ENGINE_CASES", "add_arguments", "cases", "exit_status", "print_table", "run"]

WALL = frozenset(
    {
        "wall_seconds",
        "requests_per_wall_second",
        "cpu_seconds",
        "requests_per_cpu_second",
        "steps_per_wall_second",
    }
)
"""Keys that measure the wall clock or the CPU, left out of every digest."""

ENGINE_CASES: tuple[tuple[int, int, int, int], ...] = (
    (16, 256, 3000, 0),
    (16, 64, 2000, 1),
    (1, 32, 500, 2),
    (256, 256, 3000, 3),
)
"""``bench engine`` loads: (block size, sessions, requests, seed)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``sessionroute bench digest``."""
    parser.add_argument(
        "mode", choices=["save", "check"], help="save the digests, or check against them"
    )
    parser.add_argument("file", type=Path, help="the digest file (JSON)")
    parser.add_argument(
        "only", nargs="*", metavar="NAME-FRAGMENT", help="run only cases whose name has one"
    )


def _digest(obj: Any) -> str:
    """First 16 hex digits of the SHA-256 of ``obj``'s sorted JSON."""
    text = json.dumps(obj, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _sim(spec: dict[str, Any], policy: str) -> list[Any]:
    """Digest of one simulation's whole output, and its finished requests."""
    from sessionroute.clock import ManualClock
    from sessionroute.sim import SimSpec, run_simulation

    res = run_simulation(SimSpec.model_validate(spec), policy, seed=0, wall_clock=ManualClock())
    m = {k: v for k, v in res.metrics.items() if k not in WALL}
    return [_digest([m, res.timeseries, res.steps, res.samples]), m.get("requests_completed")]


def _engine(block_size: int, sessions: int, requests: int, seed: int) -> list[Any]:
    """Digest of one ``bench engine`` run (fast path) without its wall-clock numbers."""
    from sessionroute.bench.closed_loop import run_closed_loop
    from sessionroute.replica import PROFILES, ReplicaConfig

    cfg = ReplicaConfig(PROFILES["glm45air-h200-tp8"], block_size=block_size)
    r = run_closed_loop(
        cfg, fast=True, sessions=sessions, max_context=60000, requests=requests, seed=seed
    )
    return [_digest({k: v for k, v in r.items() if k not in WALL}), r["requests"]]


def cases() -> dict[str, tuple[dict[str, Any], str]]:
    """The simulation cases: name -> (spec, policy)."""
    from sessionroute.router.policies.registry import policy_names

    swe3: dict[str, Any] = {"kind": "swe-rl", "steps": 3}
    out: dict[str, tuple[dict[str, Any], str]] = {
        f"swe-rl-3/{p}": ({"workload": swe3}, p) for p in policy_names()
    }
    faults: list[dict[str, Any]] = [
        {"at_s": 300, "replica": 1, "kind": "down"},
        {"at_s": 600, "replica": 1, "kind": "up"},
        {"at_s": 200, "replica": 0, "kind": "slow", "factor": 2.5},
        {"at_s": 500, "kind": "add"},
        {"at_s": 700, "replica": 2, "kind": "drain"},
    ]
    sll = "sticky_least_loaded"
    out["swe-rl-4/faults"] = ({"workload": {"kind": "swe-rl", "steps": 4}, "faults": faults}, sll)
    out["swe-rl-3/bs1-noscrape"] = (
        {
            "workload": swe3,
            "replicas": {"block_size": 1, "count": 2},
            "router": {"scrape_interval_s": None},
        },
        sll,
    )
    small_kv: dict[str, Any] = {"block_size": 64, "kv_capacity_tokens": 600000, "max_num_seqs": 64}
    out["swe-rl-3/bs64-small-kv"] = ({"workload": swe3, "replicas": small_kv}, "consistent_hash")
    toy_profile: dict[str, Any] = {"profile": "toy-8b-h100-tp1", "count": 4}
    out["swe-rl-3/toyprofile"] = ({"workload": swe3, "replicas": toy_profile}, sll)
    out["toy/sll"] = ({"workload": {"kind": "toy"}}, sll)
    out["toy/ch"] = ({"workload": {"kind": "toy"}}, "consistent_hash")
    mooncake: dict[str, Any] = {"kind": "trace:mooncake", "options": {"max_requests": 3000}}
    out["mooncake-3000"] = ({"workload": mooncake}, sll)
    weka: dict[str, Any] = {
        "workload": {"kind": "trace:weka", "options": {}},
        "sim": {"max_simulated_s": 600},
    }
    out["weka"] = (weka, sll)
    return out


def _wanted(name: str, only: list[str]) -> bool:
    return not only or any(fragment in name for fragment in only)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Digest every wanted case (one line per case on stderr as it finishes); save or check.

    Raises:
        ConfigError: ``check`` against a file that does not exist or is not a digest file.

    Returns:
        ``mode``, ``file``, ``cases`` (name -> [digest, finished requests]), ``different``
        (``check``: the cases whose digest changed) and ``missing`` (``check``: cases run that
        the file does not have, so nothing was compared for them).
    """
    from sessionroute.errors import ConfigError

    only: list[str] = list(args.only)
    path: Path = args.file
    ref: dict[str, Any] = {}
    if args.mode == "check":
        try:
            ref = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read digest file {str(path)!r}: {exc}") from None
        if not isinstance(ref, dict):
            raise ConfigError(f"{str(path)!r} is not a digest file (a JSON object)")
    out: dict[str, list[Any]] = {}
    for name, (spec, policy) in cases().items():
        if _wanted(name, only):
            try:
                out[name] = _sim(spec, policy)
            except Exception as exc:  # a missing trace: the error is the recorded result
                out[name] = ["error", repr(exc)[:200]]
            print(name, out[name], file=sys.stderr, flush=True)
    for bs, sessions, n, seed in ENGINE_CASES:
        name = f"engine/bs{bs}-s{sessions}-n{n}"
        if _wanted(name, only):
            out[name] = _engine(bs, sessions, n, seed)
            print(name, out[name], file=sys.stderr, flush=True)
    if args.mode == "save":
        path.write_text(json.dumps(out, indent=1), encoding="utf-8")
    different = [k for k in out if k in ref and list(ref[k]) != out[k]]
    missing = [k for k in out if args.mode == "check" and k not in ref]
    return {
        "mode": args.mode,
        "file": str(path),
        "cases": out,
        "different": different,
        "missing": missing,
    }


def exit_status(result: dict[str, Any]) -> int:
    """1 when ``check`` found a changed digest, else 0."""
    return 1 if result["different"] else 0


def print_table(result: dict[str, Any]) -> None:
    """One line per case, then the verdict."""
    for name, value in result["cases"].items():
        mark = "DIFFERENT" if name in result["different"] else ""
        print(f"{name:38} {value[0]:>16} {value[1]!s:>8} {mark}".rstrip())
    if result["missing"]:
        print("not in the file (not compared):", " ".join(result["missing"]))
    if result["mode"] == "save":
        print(f"saved {len(result['cases'])} digests to {result['file']}")
    elif result["different"]:
        print("DIFFERENT:", " ".join(result["different"]))
    else:
        print("ALL IDENTICAL")
