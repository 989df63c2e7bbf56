#!/usr/bin/env bash
# vllm-router's own integration tests (py_test/integration of github.com/vllm-project/router)
# against vllm-router and against `sessionroute serve`, the launcher swapped.
#
# Usage: scripts/vllm_router_py_test.sh ROUTER_CHECKOUT [vllm-router|sessionroute|both] [PYTEST_ARGS...]
#
# ROUTER_CHECKOUT is a checkout of vllm-project/router (its py_test/ directory is used as is;
# nothing of it is copied into this repository). The tests start routers with
# `python3 -m vllm_router.launch_router ARGS...` (py_test/fixtures/router_manager.py) and mock
# workers with `python3 py_test/fixtures/mock_worker.py` (FastAPI + uvicorn). For the
# `sessionroute` target a shim package `vllm_router` whose `launch_router` runs
# `python -m sessionroute.cli serve ARGS...` comes first on PYTHONPATH: the same command line,
# the same flags, another router. `vllm-router` runs the installed vllm_router package (pip
# install vllm-router==0.1.17). Tests that need the Rust binary built from the checkout (WASM
# middleware) skip themselves; prefill/decode disaggregation is a feature sessionroute refuses
# by name, so its tests fail on sessionroute at startup.
#
# Environment: SR_PYTHON (an interpreter with sessionroute, vllm-router, fastapi, uvicorn,
# requests and pytest; default .venv/bin/python, else python3). Writes one JUnit XML per target
# to ${PY_TEST_OUT:-runs/vllm-router-py-test}/<target>.xml and prints pytest's summary; exits
# with the last pytest status.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
if [ $# -lt 1 ] || [ ! -d "$1/py_test/integration" ]; then
    echo "usage: $0 ROUTER_CHECKOUT [vllm-router|sessionroute|both] [PYTEST_ARGS...]" >&2
    echo "  ROUTER_CHECKOUT: a checkout of https://github.com/vllm-project/router (with py_test/)" >&2
    exit 2
fi
CHECKOUT=$(cd "$1" && pwd)
TARGET=${2:-both}
shift $(($# >= 2 ? 2 : 1))
PY=${SR_PYTHON:-}
if [ -z "$PY" ]; then
    if [ -x "$REPO/.venv/bin/python" ]; then PY=$REPO/.venv/bin/python; else PY=$(command -v python3); fi
fi
OUT=${PY_TEST_OUT:-$REPO/runs/vllm-router-py-test}
mkdir -p "$OUT"
SHIM=$(mktemp -d)
trap 'rm -rf "$SHIM"' EXIT
mkdir -p "$SHIM/vllm_router"
: > "$SHIM/vllm_router/__init__.py"
cat > "$SHIM/vllm_router/launch_router.py" <<'PY'
"""vllm-router's launcher, swapped: the same command line runs ``sessionroute serve``."""
import os
import sys

os.execv(sys.executable, [sys.executable, "-m", "sessionroute.cli", "serve", *sys.argv[1:]])
PY
# the tests call `python3`: make it the interpreter that has everything
BIN=$SHIM/bin
mkdir -p "$BIN"
printf '#!/bin/sh\nexec "%s" "$@"\n' "$PY" > "$BIN/python3"
chmod +x "$BIN/python3"

run() {
    local target=$1
    shift
    local pypath=$REPO/src${PYTHONPATH:+:$PYTHONPATH}
    if [ "$target" = sessionroute ]; then pypath=$SHIM:$pypath; fi
    echo "== py_test/integration on $target"
    (cd "$CHECKOUT" && PATH=$BIN:$PATH PYTHONPATH=$pypath "$PY" -m pytest py_test/integration \
        -p no:cacheprovider -q -rA --junitxml="$OUT/$target.xml" "$@")
}

status=0
case $TARGET in
    vllm-router | sessionroute) run "$TARGET" "$@" || status=$? ;;
    both)
        run vllm-router "$@" || status=$?
        run sessionroute "$@" || status=$?
        ;;
    *) echo "unknown target $TARGET (vllm-router, sessionroute or both)" >&2; exit 2 ;;
esac
exit $status
