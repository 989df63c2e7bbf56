"""``sessionroute emulate``: run emulated vLLM replicas backed by the replica model."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

__all__ = ["register", "settings_from_args"]


def register(sub: Any) -> None:
    """Add the ``emulate`` subcommand to ``sub`` (an argparse subparsers object)."""
    parser = sub.add_parser(
        "emulate",
        help="run emulated vLLM replicas (OpenAI API backed by the replica model)",
        description=(
            "Start N vLLM-compatible OpenAI servers on consecutive ports, each backed by the "
            "replica model in real time (scaled by --time-scale), and print their URLs one per "
            "line. Runs until Ctrl-C or SIGTERM. See docs/emulator.md."
        ),
        allow_abbrev=False,
    )
    a = parser.add_argument
    a("--replicas", type=int, default=1, help="number of replicas (default 1)")
    a("--profile", default="toy-8b-h100-tp1", help="step-time profile (default toy-8b-h100-tp1)")
    a("--profile-file", default=None, help="TOML/JSON file with extra profiles (see docs)")
    a(
        "--time-scale",
        type=float,
        default=1.0,
        help="simulated seconds per wall second (10: ten times faster than the GPU; default 1)",
    )
    a("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    a(
        "--port",
        type=int,
        default=8100,
        help="first port; replica i uses port+i (default 8100; 0: free ports)",
    )
    a("--model", default=None, help="served model name (default: the profile name)")
    a("--block-size", type=int, default=16, help="tokens per KV block (default 16)")
    a("--kv-capacity-tokens", type=int, default=None, help="KV capacity (default: profile's)")
    a("--max-num-batched-tokens", type=int, default=None, help="token budget per step")
    a("--max-num-seqs", type=int, default=None, help="running requests at most")
    a("--max-model-len", type=int, default=None, help="prompt + output tokens at most")
    a("--slowdown", type=float, default=1.0, help="factor on every step time (default 1)")
    a(
        "--default-max-tokens",
        type=int,
        default=16,
        help="tokens generated when a request has no max_tokens (default 16)",
    )
    a(
        "--stream-interval-ms",
        type=float,
        default=5.0,
        help="wall ms between token progress reads while streaming (default 5)",
    )
    a(
        "--kv-events-config",
        default=None,
        metavar="JSON",
        help="vLLM's KV cache events config, e.g. "
        '\'{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://127.0.0.1:5557"}\' '
        "(the PUB socket connects unless the endpoint has '*'; replica i uses port + i; "
        "docs/kv_aware.md)",
    )
    a(
        "--prefix-caching-hash-algo",
        default="sha256",
        choices=["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"],
        help="hash of the published block hashes (vLLM's flag; default sha256)",
    )
    a(
        "--fault-routes",
        action="store_true",
        help='also serve POST /fault/slowdown {"factor": F} (slow the replica down F times '
        "at run time, for fault benches; off by default: not for production-like use)",
    )
    a(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="log level (default info)",
    )
    parser.set_defaults(handler=_run)


def settings_from_args(args: argparse.Namespace) -> Any:
    """The :class:`~sessionroute.emulate.EmulatorSettings` of parsed arguments.

    Raises:
        ConfigError: an invalid value or an unknown profile.
    """
    from sessionroute.emulate import EmulatorSettings
    from sessionroute.emulate.kvevents import KvEventsConfig
    from sessionroute.errors import ConfigError
    from sessionroute.replica import PROFILES, load_profiles

    profile: Any = args.profile
    if args.profile_file is not None:
        try:
            extra = load_profiles(args.profile_file)
        except OSError as exc:
            raise ConfigError(f"--profile-file {args.profile_file!r}: {exc}") from None
        known = {**PROFILES, **extra}
        if profile not in known:
            raise ConfigError(f"unknown profile {profile!r}; known: {', '.join(sorted(known))}")
        profile = known[profile]
    return EmulatorSettings(
        profile=profile,
        model=args.model,
        time_scale=args.time_scale,
        host=args.host,
        port=args.port,
        block_size=args.block_size,
        kv_capacity_tokens=args.kv_capacity_tokens,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len,
        slowdown=args.slowdown,
        default_max_tokens=args.default_max_tokens,
        stream_interval_s=args.stream_interval_ms / 1000.0,
        kv_events=None
        if args.kv_events_config is None
        else KvEventsConfig.from_json(args.kv_events_config),
        prefix_caching_hash_algo=args.prefix_caching_hash_algo,
        fault_routes=args.fault_routes,
    )


def _run(args: argparse.Namespace) -> int:
    from sessionroute.emulate import run
    from sessionroute.errors import ConfigError

    try:
        if args.replicas < 1:
            raise ConfigError(f"--replicas must be >= 1, got {args.replicas}")
        if args.port and args.port + args.replicas - 1 > 65535:
            raise ConfigError(f"--port {args.port} + {args.replicas} replicas exceeds 65535")
        settings = settings_from_args(args)
    except ConfigError as exc:
        print(f"sessionroute emulate: error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        run(args.replicas, settings)
    except OSError as exc:
        print(f"sessionroute emulate: error: {exc}", file=sys.stderr)
        return 1
    return 0
