#!/usr/bin/env bash
# Sim-vs-real fidelity on one GPU, in at most 8 minutes (issue 35, item 5; docs/simulator.md,
# "Calibrating against a real server").
#
# On a machine with one NVIDIA GPU and vLLM installed (no hub access needed): starts
# $GPU_SERVERS vLLM servers on a small local model, sharing the GPU; fits a step-time profile to
# them with `sessionroute calibrate`; runs the fidelity comparison (`sessionroute compare FILE
# --fidelity --profile PROFILE`: every arm live and simulated with the same seeds) on a
# multi-turn workload; writes everything and a summary table to $GPU_OUT. Refuses (exit 2) on a
# machine without a GPU, without vLLM or without the model.
#
# Environment:
#   GPU_MODEL        local model directory (default /models/Qwen2.5-0.5B-Instruct)
#   VLLM_PYTHON      interpreter that has vllm (default: python3)
#   SR_PYTHON        interpreter that has sessionroute (default: python if it imports it,
#                    else .venv/bin/python)
#   GPU_SERVERS      vLLM servers on the one GPU (default 2)
#   GPU_MEM_FRACTION --gpu-memory-utilization of each (default 0.85 / GPU_SERVERS)
#   GPU_KV_BYTES     --kv-cache-memory-bytes of each (default 1G; smaller forces eviction)
#   GPU_MAX_SEQS     --max-num-seqs (default 64)
#   GPU_MAX_LEN      --max-model-len (default 4096)
#   GPU_BASE_PORT    first server's port (default 18600)
#   GPU_OUT          output directory (default runs/gpu-fidelity)
#   GPU_BUDGET_S     wall-clock budget of the whole script (default 480)
set -euo pipefail
cd "$(dirname "$0")/.."
T0=$SECONDS
BUDGET=${GPU_BUDGET_S:-480}
MODEL=${GPU_MODEL:-/models/Qwen2.5-0.5B-Instruct}
VLLM_PY=${VLLM_PYTHON:-python3}
N=${GPU_SERVERS:-2}
MAX_SEQS=${GPU_MAX_SEQS:-64}
MAX_LEN=${GPU_MAX_LEN:-4096}
KV_BYTES=${GPU_KV_BYTES:-1G}
BASE_PORT=${GPU_BASE_PORT:-18600}
OUT=${GPU_OUT:-runs/gpu-fidelity}
if [ -z "${SR_PYTHON:-}" ]; then
  if python -c 'import sessionroute' >/dev/null 2>&1; then SR_PYTHON=python; else SR_PYTHON=.venv/bin/python; fi
fi
MEM=${GPU_MEM_FRACTION:-$(awk -v n="$N" 'BEGIN { printf "%.3f", 0.85 / n }')}

refuse() { echo "gpu_fidelity: refused: $*" >&2; exit 2; }
left() { echo $((BUDGET - (SECONDS - T0))); }

# -- preconditions: a GPU, vLLM, the model, sessionroute ------------------------------------------
command -v nvidia-smi >/dev/null 2>&1 || refuse "no nvidia-smi: this script needs one NVIDIA GPU"
CARD=$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -n 1) \
  || refuse "nvidia-smi finds no GPU"
[ -n "$CARD" ] || refuse "nvidia-smi finds no GPU"
"$VLLM_PY" -c 'import vllm' >/dev/null 2>&1 || refuse "$VLLM_PY cannot import vllm (set VLLM_PYTHON)"
[ -f "$MODEL/config.json" ] || refuse "no model at $MODEL (set GPU_MODEL to a local model directory)"
"$SR_PYTHON" -c 'import sessionroute' >/dev/null 2>&1 || refuse "$SR_PYTHON cannot import sessionroute"
mkdir -p "$OUT"
echo "== gpu_fidelity on $CARD: $N x vLLM ($("$VLLM_PY" -c 'import vllm; print(vllm.__version__)')), model $MODEL"

# -- servers ---------------------------------------------------------------------------------------
PIDS=()
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu-fidelity.XXXXXX")
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT
URLS=()
for i in $(seq 0 $((N - 1))); do
  PORT=$((BASE_PORT + i))
  URLS+=("http://127.0.0.1:$PORT")
  VLLM_SERVER_DEV_MODE=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 \
  VLLM_CACHE_ROOT="$WORK/cache-$i" \
    "$VLLM_PY" -m vllm.entrypoints.openai.api_server --model "$MODEL" --served-model-name model \
    --host 127.0.0.1 --port "$PORT" --gpu-memory-utilization "$MEM" \
    --kv-cache-memory-bytes "$KV_BYTES" --max-model-len "$MAX_LEN" --max-num-seqs "$MAX_SEQS" \
    --enable-prefix-caching --enable-prompt-tokens-details --disable-uvicorn-access-log \
    >"$OUT/server-$i.log" 2>&1 &
  PIDS+=("$!")
done
for i in "${!URLS[@]}"; do
  until curl -sf "${URLS[$i]}/health" >/dev/null 2>&1; do
    if ! kill -0 "${PIDS[$i]}" 2>/dev/null; then
      tail -n 30 "$OUT/server-$i.log"; echo "gpu_fidelity: FAIL: server $i exited"; exit 1
    fi
    [ "$(left)" -gt 240 ] || { tail -n 30 "$OUT/server-$i.log"; echo "gpu_fidelity: FAIL: servers not up with 4 min left"; exit 1; }
    sleep 2
  done
done
echo "== servers up after $((SECONDS - T0)) s: ${URLS[*]}"

# -- calibrate -------------------------------------------------------------------------------------
URL_FLAGS=()
for u in "${URLS[@]}"; do URL_FLAGS+=(--url "$u"); done
timeout "$(( $(left) - 150 ))" "$SR_PYTHON" -m sessionroute.cli calibrate "${URL_FLAGS[@]}" \
  --probe first --check --out "$OUT/profile.toml" | tee "$OUT/calibrate.txt"
echo "== calibrated after $((SECONDS - T0)) s"

# -- fidelity comparison ---------------------------------------------------------------------------
URL_LIST=$(printf '"%s", ' "${URLS[@]}")
cat >"$OUT/gpu_fidelity.toml" <<EOF
# written by scripts/gpu_fidelity.sh: a multi-turn workload on the running servers
name = "gpu-fidelity"
[workload]
kind = "toy"
[workload.options]
sessions = 24
arrival_rate_per_s = 6.0
turns_p50 = 4
turns_p90 = 6
turns_max = 6
system_prompt_tokens = 256
first_p50 = 600
first_p90 = 1200
output_p50 = 96
output_p90 = 192
output_cap = 256
followup_p50 = 128
followup_p90 = 384
think_p50_s = 0.3
think_p90_s = 1.0
[replicas]
count = $N
profile = "$OUT/profile.toml"
[run]
repeats = 2
[live]
replicas = "urls"
urls = [${URL_LIST%, }]
served_model = "model"
router = "sessionroute"
stream = true
[[arms]]
policy = "sticky_least_loaded"
[[arms]]
policy = "random"
[[arms]]
policy = "round_robin"
EOF
if "$SR_PYTHON" -m sessionroute.cli compare --help 2>/dev/null | grep -q -- '--fidelity'; then
  timeout "$(( $(left) - 5 ))" "$SR_PYTHON" -m sessionroute.cli compare "$OUT/gpu_fidelity.toml" \
    --fidelity --profile "$OUT/profile.toml" --out "$OUT/compare" | tee "$OUT/fidelity.txt"
else
  echo "gpu_fidelity: this sessionroute has no 'compare --fidelity' yet: calibration only" \
    | tee "$OUT/fidelity.txt"
fi

# -- summary ---------------------------------------------------------------------------------------
{
  echo "# GPU fidelity: $CARD"
  echo
  echo "vLLM $("$VLLM_PY" -c 'import vllm; print(vllm.__version__)'), model $MODEL, $N servers" \
    "(--gpu-memory-utilization $MEM, --kv-cache-memory-bytes $KV_BYTES, --max-num-seqs $MAX_SEQS)," \
    "$(date -u +%Y-%m-%dT%H:%M:%SZ), $((SECONDS - T0)) s."
  echo
  echo '## calibrate'
  echo '```'
  cat "$OUT/calibrate.txt"
  echo '```'
  echo '## compare --fidelity'
  echo '```'
  cat "$OUT/fidelity.txt"
  echo '```'
} >"$OUT/gpu_fidelity.md"
echo "gpu_fidelity: done in $((SECONDS - T0)) s; table in $OUT/gpu_fidelity.md"
