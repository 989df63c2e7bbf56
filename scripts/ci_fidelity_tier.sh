#!/usr/bin/env bash
# CI fidelity tier: the simulator against real vLLM on this CPU (docs/simulator.md, "How far to
# trust it"; issue 35).
#
# `sessionroute compare examples/fidelity_vllm_cpu.toml --fidelity` starts 2 vLLM servers
# (16 MiB KV each), calibrates the step-time profile on them (`sessionroute calibrate`'s fit,
# then the request path's delay from probe requests of its own sent the arms' way; before any
# arm runs: the profile is never tuned on the runs it is compared with), runs the real-vLLM
# tier's workload, sticky_least_loaded and random, every arm twice live with the same seed, and
# simulates every arm with the servers' KV size, batch limits and worker URLs. Then
# examples/fidelity_vllm_cpu_pressure.toml, the KV-pressure setting, on 2 servers of 2 MiB KV
# (LRU eviction and preemptions at a load the 2-core machine carries) with the profile fitted
# first. scripts/check_fidelity.py checks issue 35's bounds on each: per arm hit rate within 3
# points, output tok/s within 10 %, TTFT p50 and ITL p50 within 25 %; the same arm order
# wherever the live difference exceeds the live spread; under pressure, preemptions on both
# sides or neither, and the pressure setting really preempts and evicts on the servers; and
# scripts/vllm_scheduler_check.py replays every live run's turns through vLLM's own scheduler
# and through the replica model, which must agree request for request. What
# the simulator meets reliably on the 2-core CPU tier gates (docs/simulator.md, "How far to
# trust it"); the rest is printed and counted; FIDELITY_STRICT=1 gates every check.
#
# Usage: scripts/ci_fidelity_tier.sh MODEL_DIR [OUT_DIR]   (MODEL_DIR from `sessionroute
# tiny-model`; OUT_DIR default runs/fidelity-tier, the pressure setting's in OUT_DIR/pressure).
# Environment: VLLM_VENV (the vLLM venv, as in scripts/ci_vllm_tier.sh), SR_PYTHON (an
# interpreter with sessionroute), FIDELITY_FILE (default examples/fidelity_vllm_cpu.toml),
# FIDELITY_PRESSURE_FILE (default examples/fidelity_vllm_cpu_pressure.toml; "" skips it),
# FIDELITY_PROFILE (a profile file instead of calibrating), FIDELITY_STRICT=1 (every bound
# gates). scripts/ci_vllm_tier.sh calls it with the model it built.
set -euo pipefail
cd "$(dirname "$0")/.."
T0=$SECONDS
MODEL=${1:?usage: scripts/ci_fidelity_tier.sh MODEL_DIR [OUT_DIR]}
OUT=${2:-$PWD/runs/fidelity-tier}
VENV=${VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/sessionroute/vllm-venv}
FILE=${FIDELITY_FILE:-examples/fidelity_vllm_cpu.toml}
if [ -z "${SR_PYTHON:-}" ]; then
  if python -c 'import sessionroute' >/dev/null 2>&1; then SR_PYTHON=python; else SR_PYTHON=.venv/bin/python; fi
fi
PROFILE_ARGS=()
if [ -n "${FIDELITY_PROFILE:-}" ]; then PROFILE_ARGS=(--profile "$FIDELITY_PROFILE"); fi

PRESSURE=${FIDELITY_PRESSURE_FILE-examples/fidelity_vllm_cpu_pressure.toml}
STRICT=()
if [ "${FIDELITY_STRICT:-0}" = 1 ]; then STRICT=(--strict); fi

echo "== fidelity: $FILE, simulator vs 2 vLLM servers (calibrated on them first)"
rm -rf "$OUT"
TINY_MODEL="$MODEL" VLLM_PYTHON="$VENV/bin/python" \
  "$SR_PYTHON" -m sessionroute.cli compare "$FILE" --fidelity --out "$OUT" "${PROFILE_ARGS[@]}"
OK=1
"$SR_PYTHON" scripts/check_fidelity.py "$OUT/fidelity.json" "${STRICT[@]}" || OK=0
if [ -n "$PRESSURE" ]; then
  echo "== fidelity: $PRESSURE, KV pressure on 2 vLLM servers of 2 MiB KV (profile: $OUT/profile.toml)"
  TINY_MODEL="$MODEL" VLLM_PYTHON="$VENV/bin/python" \
    "$SR_PYTHON" -m sessionroute.cli compare "$PRESSURE" --fidelity --out "$OUT/pressure" \
    --profile "$OUT/profile.toml"
  "$SR_PYTHON" scripts/check_fidelity.py "$OUT/pressure/fidelity.json" \
    --pressure-suffix=-pressure "${STRICT[@]}" || OK=0
fi
# the replica model's scheduler and KV cache against vLLM's own Scheduler and KVCacheManager on
# the live runs' turns (same arrivals, same step times: only the mechanics can differ)
for dir in "$OUT" ${PRESSURE:+"$OUT/pressure"}; do
  echo "== scheduler: the replica model against vLLM's own scheduler on $dir/turns.json"
  PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" "$VENV/bin/python" \
    scripts/vllm_scheduler_check.py "$dir" --model "$MODEL" || OK=0
done
[ "$OK" = 1 ] || { echo "fidelity tier: FAIL after $((SECONDS - T0)) s (above)"; exit 1; }
echo "fidelity tier: passed in $((SECONDS - T0)) s (report: $OUT/report.html)"
