"""``calibrate`` against one real vLLM CPU server (shared/REAL_VLLM.md settings).

Needs the vLLM venv (``scripts/ci_vllm_tier.sh`` installs it) and ``SESSIONROUTE_VLLM_TESTS=1``:
the plain test run happens while CI installs that venv in the background, and a vLLM server
takes 1.2 GB and a minute to start. Holds ``/tmp/vllm.lock`` (one set of vLLM servers at a
time on a machine).
"""

from __future__ import annotations

import fcntl
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from sessionroute.calibrate import calibrate, write_profile
from sessionroute.experiments.live.vllm_cpu import vllm_cpu_env
from sessionroute.experiments.spec import load_experiment, resolve_arms
from sessionroute.sim import SimSpec, replica_config

VENV = Path(
    os.environ.get(
        "VLLM_VENV",
        Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "sessionroute/vllm-venv",
    )
)
PYTHON = VENV / "bin" / "python"

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(not PYTHON.exists(), reason=f"no vLLM venv at {VENV}"),
    pytest.mark.skipif(
        os.environ.get("SESSIONROUTE_VLLM_TESTS") != "1", reason="SESSIONROUTE_VLLM_TESTS != 1"
    ),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    work = tmp_path_factory.mktemp("vllm")
    model = work / "model"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "sessionroute.cli",
            "tiny-model",
            str(model),
            "--python",
            str(PYTHON),
        ],
        check=True,
        capture_output=True,
    )
    port = _free_port()
    argv = [
        str(PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
        "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "float32", "--max-model-len", "2048", "--max-num-seqs", "16",
        "--enable-prefix-caching", "--block-size", "32", "--kv-cache-memory-bytes", "64M",
        "--enable-prompt-tokens-details", "--enforce-eager", "--disable-uvicorn-access-log",
    ]  # fmt: skip
    env = {**os.environ, **vllm_cpu_env(str(work / "cache"))}
    with open("/tmp/vllm.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        log = open(work / "server.log", "w")  # noqa: SIM115 - closed below
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 600
            while True:
                if proc.poll() is not None:
                    pytest.fail(f"vLLM exited: {(work / 'server.log').read_text()[-2000:]}")
                try:
                    with urllib.request.urlopen(f"{url}/health", timeout=2):
                        break
                except OSError:
                    if time.monotonic() > deadline:
                        pytest.fail("vLLM did not come up in 600 s")
                    time.sleep(1)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()


def test_calibrate_real_server_within_3_minutes_and_round_trips(
    vllm_server: str, tmp_path: Path
) -> None:
    t0 = time.monotonic()
    result = calibrate([vllm_server])
    wall = time.monotonic() - t0
    print(f"calibrate wall {wall:.1f} s; fit RMS {result.fit.rms_error():.1%}")
    for t in result.fit.terms:
        print(t.name, t.value, t.rel_err)
    assert wall <= 180  # issue 35: one real CPU server in <= 3 minutes
    info = result.servers[0]
    assert (info.block_size, info.max_num_seqs, info.max_model_len) == (32, 16, 2048)
    assert info.vllm_version is not None and info.can_reset_cache
    assert result.fit.values["b0_s"] > 0
    path = write_profile(result, tmp_path / "profile.toml")
    exp = tmp_path / "exp.toml"
    exp.write_text(
        f'[workload]\nkind = "toy"\n[replicas]\ncount = 1\nprofile = "{path}"\n'
        '[[arms]]\npolicy = "random"\n'
    )
    (arm,) = resolve_arms(load_experiment(exp))
    _, cfg = replica_config(SimSpec.from_settings(arm.settings))
    assert cfg.profile == result.profile
    assert (cfg.block_size, cfg.capacity_tokens, cfg.seqs, cfg.model_len) == (
        32,
        info.kv_capacity_tokens,
        16,
        2048,
    )
