"""Groups of ``sessionroute serve`` flags beyond routing and health (added by
:func:`sessionroute.serve.flags.add_arguments`): vllm-router's rate limit, sessionroute's
hardening (limits, failure handling, admin access) and kv_aware's event streams."""

from __future__ import annotations

import argparse

from sessionroute.serve.flag_defaults import DEFAULTS

__all__ = ["add_hardening_arguments", "add_kv_arguments", "add_rate_limit_arguments"]


def add_rate_limit_arguments(parser: argparse.ArgumentParser) -> None:
    """vllm-router's rate limit: a token bucket in front of placement and its queue."""
    limits = parser.add_argument_group(
        "rate limit (vllm-router's)",
        "A token bucket in front of placement: each proxied request takes a token and gives it "
        "back when it completes; without one it waits in the queue (FIFO). Refused: 429 with "
        "Retry-After: 1 when the queue is full, 408 when the wait times out. Off unless "
        "--max-concurrent-requests or --rate-limit-tokens-per-second is given (vllm-router's "
        "default, 32768, never limits in practice).",
    )
    limits.add_argument(
        "--max-concurrent-requests",
        type=int,
        default=None,
        help="the bucket's capacity (vllm-router's default: 32768)",
    )
    limits.add_argument(
        "--rate-limit-tokens-per-second",
        type=float,
        default=None,
        help="tokens added per second (default: --max-concurrent-requests)",
    )
    limits.add_argument(
        "--queue-size",
        type=int,
        default=None,
        help="requests that may wait for a token (0: refuse at once; default 100 with the "
        "limit, else --admission-max-waiting)",
    )
    limits.add_argument(
        "--queue-timeout-secs",
        type=float,
        default=None,
        help="longest wait in the queue (default: --admission-max-wait-secs, 60)",
    )


def add_hardening_arguments(parser: argparse.ArgumentParser) -> None:
    """Limits, failure handling and admin access (sessionroute only; issue 19)."""
    d = DEFAULTS
    a = parser.add_argument
    a(
        "--max-session-id-bytes",
        type=int,
        default=d["max_session_id_bytes"],
        help="longest session id accepted; a longer one, or one with a control character, "
        "is a 400 before placement (default: %(default)s)",
    )
    a(
        "--session-table-max-bytes",
        type=int,
        default=d["session_table_max_bytes"],
        help="capacity of the session table in estimated bytes (each entry: its session "
        "id's length + 256); past it the least recently used session is evicted, as past "
        "the entry cap (policy option max_sessions) (default: %(default)s, 256 MiB)",
    )
    a(
        "--first-byte-timeout-secs",
        type=float,
        default=d["first_byte_timeout_secs"],
        help="a streaming request whose worker sends no response head within this many "
        "seconds is cancelled there and placed again (a hung worker); 0 disables "
        "(default: %(default)s)",
    )
    a(
        "--retry-after-send",
        action=argparse.BooleanOptionalAction,
        default=d["retry_after_send"],
        help="retry a request whose worker connection broke after the request was fully "
        "sent, before any byte reached the client, as vllm-router does (a worker that "
        "crashed mid-request); --no-retry-after-send retries only requests that provably "
        "did not reach the worker, so none runs twice (default: %(default)s)",
    )
    a(
        "--max-connections",
        type=int,
        default=d["max_connections"],
        help="most client connections at once; more are closed at once and counted "
        "(default: %(default)s)",
    )
    a(
        "--header-timeout-secs",
        type=float,
        default=d["header_timeout_secs"],
        help="a client must send a whole request head, and keep its body coming, within "
        "this many seconds, or its connection is closed and counted (default: %(default)s)",
    )
    a(
        "--idle-timeout-secs",
        type=float,
        default=d["idle_timeout_secs"],
        help="idle keep-alive client connections are closed after this many seconds "
        "(default: %(default)s)",
    )
    a(
        "--allow-remote-admin",
        action="store_true",
        help="without --router-api-key, let clients other than loopback ones use the admin "
        "routes (/add_worker, /remove_worker, POST /workers, DELETE /workers/URL, "
        "/sessions/ID); with a key they need the key",
    )
    a(
        "--route-receipts",
        action="store_true",
        help="add an x-sessionroute-route header to each proxied response naming the policy, "
        "the worker, the reason (new, sticky, repinned, moved, stateless), the session and "
        "its origin, and the wait at the router (off: no cost)",
    )
    a(
        "--usage-metrics",
        action="store_true",
        help="count prompt and cached prompt tokens per worker from the usage of complete "
        "JSON answers (sessionroute_worker_prompt_tokens_total, ..._cached_prompt_tokens_total; "
        "streamed answers are not scanned)",
    )
    a(
        "--route-receipts-log",
        default=None,
        metavar="PATH",
        help="with --route-receipts, also append each receipt as a JSON line to PATH "
        "('-': standard error)",
    )
    a(
        "--expose-worker-header",
        action="store_true",
        help="name the worker that served each proxied request in an x-sessionroute-worker "
        "response header",
    )


def add_kv_arguments(parser: argparse.ArgumentParser) -> None:
    """kv_aware's KV cache event streams and the servers' tokenizer and block hashes."""
    d = DEFAULTS
    kv = parser.add_argument_group(
        "kv_aware (sessionroute only)",
        "The replicas' prefix caches, learned from vLLM's KV cache events (docs/kv_aware.md). "
        'Start each vLLM server with --kv-events-config \'{"enable_kv_cache_events": true, '
        '"publisher": "zmq", "endpoint": "tcp://ROUTER_HOST:PORT"}\' (and optionally '
        '"replay_endpoint": "tcp://*:RPORT"); give the router the same address per worker.',
    )
    kv.add_argument(
        "--kv-events",
        action="append",
        default=[],
        metavar="URL=ENDPOINT[,REPLAY]",
        help="worker URL, the ZMQ address the router binds for its KV events, and optionally "
        "the server's replay address (repeatable, one per worker)",
    )
    kv.add_argument(
        "--kv-tokenizer",
        default=None,
        metavar="DIR",
        help="local model directory with the servers' tokenizer.json and chat template: "
        "requests are tokenized and hashed into vLLM block hashes (without it kv_aware "
        "matches nothing and routes by load alone); 'emulator': the tokenizer of "
        "sessionroute emulate",
    )
    kv.add_argument(
        "--kv-block-size",
        type=int,
        default=d["kv_block_size"],
        help="the servers' --block-size (default: %(default)s)",
    )
    kv.add_argument(
        "--kv-hash-algo",
        default=d["kv_hash_algo"],
        choices=["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"],
        help="the servers' --prefix-caching-hash-algo (default: %(default)s)",
    )
    kv.add_argument(
        "--kv-hash-seed",
        default=None,
        metavar="SEED",
        help="the servers' PYTHONHASHSEED, if they run with one (required for xxhash)",
    )
