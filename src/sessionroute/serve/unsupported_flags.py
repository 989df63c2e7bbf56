"""vllm-router flags that ``sessionroute serve`` does not implement: each fails with a message
naming the feature rather than being silently ignored (:func:`add_unsupported`)."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["add_unsupported"]

_UNSUPPORTED_VLLM_ROUTER_FLAGS: dict[str, str] = {
    "--vllm-pd-disaggregation": "prefill/decode disaggregation",
    "--prefill": "prefill/decode disaggregation",
    "--decode": "prefill/decode disaggregation",
    "--prefill-policy": "prefill/decode disaggregation",
    "--decode-policy": "prefill/decode disaggregation",
    "--pd-kv-events": "prefill/decode disaggregation",
    "--kv-connector": "prefill/decode disaggregation",
    "--vllm-discovery-address": "prefill/decode disaggregation",
    "--mini-lb": "MiniLB",
    "--enable-program-scheduling": "program scheduling",
    "--program-scheduling-config-json": "program scheduling",
    "--service-discovery": "Kubernetes service discovery",
    "--selector": "Kubernetes service discovery",
    "--prefill-selector": "Kubernetes service discovery",
    "--decode-selector": "Kubernetes service discovery",
    "--service-discovery-port": "Kubernetes service discovery",
    "--service-discovery-namespace": "Kubernetes service discovery",
    "--enable-igw": "multi-model gateway mode",
    "--intra-node-data-parallel-size": "data-parallel-aware routing",
    "--wasm-middleware": "WASM middleware",
    "--wasm-middleware-sha256": "WASM middleware",
    "--wasm-middleware-route": "WASM middleware",
    "--cors-allowed-origins": "CORS",
    "--kv-event-source": "kv_aware routing",
    "--kv-event-replay-source": "kv_aware routing",
    "--kv-event-block-size": "kv_aware routing",
    "--kv-event-model": "kv_aware routing",
    "--kv-aware-session-affinity-ttl-secs": "kv_aware routing",
    "--router-temperature": "kv_aware routing",
    "--kv-penalty-host": "kv_aware routing",
    "--kv-penalty-external": "kv_aware routing",
    "--kv-penalty-disk": "kv_aware routing",
    "--log-dir": "log files (logs go to stderr)",
}


class _Unsupported(argparse.Action):
    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        kwargs["nargs"] = "*"
        kwargs["help"] = argparse.SUPPRESS
        super().__init__(option_strings, dest, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        feature = _UNSUPPORTED_VLLM_ROUTER_FLAGS.get(option_string or "", "this feature")
        parser.error(
            f"{option_string} is a vllm-router option that sessionroute serve does not "
            f"support ({feature})"
        )


def add_unsupported(parser: argparse.ArgumentParser) -> None:
    """Add every unsupported vllm-router flag to ``parser`` (hidden from ``--help``); giving
    one exits with an error that names the feature."""
    for flag in _UNSUPPORTED_VLLM_ROUTER_FLAGS:
        parser.add_argument(
            flag, action=_Unsupported, dest="unsupported_" + flag.strip("-").replace("-", "_")
        )
