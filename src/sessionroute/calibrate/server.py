"""What a vLLM server says of itself, and its ``/metrics`` counters and histograms.

Sources (vLLM 0.32, ``vllm/v1/metrics/loggers.py``, ``vllm/entrypoints/serve/dev``):

- ``GET /metrics``: ``vllm:cache_config_info`` (labels ``block_size``, ``num_gpu_blocks``), the
  request histograms (``vllm:time_to_first_token_seconds``, ``vllm:inter_token_latency_seconds``,
  ``vllm:e2e_request_latency_seconds``, ``vllm:request_queue_time_seconds``,
  ``vllm:request_prefill_time_seconds``, ``vllm:request_decode_time_seconds``) and the step
  histogram ``vllm:iteration_tokens_total`` (one observation per engine step);
- ``GET /v1/models``: ``max_model_len`` of the served model;
- ``GET /server_info?config_format=json`` (``VLLM_SERVER_DEV_MODE=1`` only): the engine config,
  whose ``scheduler_config`` holds ``max_num_seqs`` and ``max_num_batched_tokens``;
- ``GET /version``: the vLLM version.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from sessionroute.errors import SessionRouteError

__all__ = [
    "HISTOGRAMS",
    "CalibrationError",
    "MetricsSnapshot",
    "ServerInfo",
    "parse_metrics",
    "read_server_info",
    "scrape",
]

HISTOGRAMS: tuple[str, ...] = (
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:request_prefill_time_seconds",
    "vllm:request_decode_time_seconds",
    "vllm:iteration_tokens_total",
)
"""vLLM histograms scraped before and after each probe phase (their ``_sum`` and ``_count``)."""

_COUNTERS: tuple[str, ...] = (
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:prefix_cache_hits_total",
    "vllm:prefix_cache_queries_total",
    "vllm:num_preemptions_total",
)


class CalibrationError(SessionRouteError):
    """A server cannot be calibrated: unreachable, not vLLM, or missing what the fit needs."""


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """One server's self-description.

    Attributes:
        url: base URL, e.g. ``http://127.0.0.1:8000`` (no trailing slash).
        model: served model name (the first of ``/v1/models``).
        block_size: KV block size, tokens.
        num_gpu_blocks: KV blocks of the cache.
        max_model_len: prompt + output tokens at most.
        max_num_seqs: running requests at most (``/server_info``, else the flag).
        max_num_batched_tokens: tokens per engine step at most (``/server_info``, else the flag).
        vllm_version: ``/version``, or None when it does not answer.
        limits_from: where the batch limits came from: ``"server_info"`` or ``"flags"``.
        can_reset_cache: whether ``POST /reset_prefix_cache`` answered 200.
    """

    url: str
    model: str
    block_size: int
    num_gpu_blocks: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    vllm_version: str | None
    limits_from: str
    can_reset_cache: bool

    @property
    def kv_capacity_tokens(self) -> int:
        """KV cache capacity that requests can use, tokens: ``(num_gpu_blocks - 1) *
        block_size`` on vLLM, whose V1 block pool keeps one block as its null block
        (``vllm/v1/core/block_pool.py``: ``self.null_block = free_block_queue.popleft()``);
        ``num_gpu_blocks * block_size`` on sessionroute's emulator (``/version`` says so)."""
        emulated = (self.vllm_version or "").startswith("sessionroute-emulator")
        return (self.num_gpu_blocks - (0 if emulated else 1)) * self.block_size


@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    """Sums of the scraped samples over label sets, by sample name (``..._sum``, ``..._count``,
    ``..._total``)."""

    values: dict[str, float]

    def get(self, name: str) -> float:
        """A sample's value, 0.0 when absent."""
        return self.values.get(name, 0.0)

    def delta(self, before: MetricsSnapshot, name: str) -> float:
        """``name`` now minus ``name`` in ``before``."""
        return self.get(name) - before.get(name)

    def mean_delta(self, before: MetricsSnapshot, histogram: str) -> float | None:
        """Mean of the observations ``histogram`` received since ``before``; None if none."""
        n = self.delta(before, f"{histogram}_count")
        if n <= 0:
            return None
        return self.delta(before, f"{histogram}_sum") / n


def parse_metrics(text: str, model: str | None = None) -> tuple[MetricsSnapshot, dict[str, str]]:
    """Parse a Prometheus text page into the snapshot the probe needs.

    Args:
        text: ``/metrics`` body.
        model: keep only samples whose ``model_name`` label is this (when they have one).

    Returns:
        The snapshot (histogram ``_sum``/``_count`` and counters) and the labels of
        ``vllm:cache_config_info`` (empty when absent).

    Raises:
        CalibrationError: the page does not parse as Prometheus text.
    """
    wanted = {f"{h}_sum" for h in HISTOGRAMS} | {f"{h}_count" for h in HISTOGRAMS}
    wanted |= set(_COUNTERS)
    values: dict[str, float] = {}
    cache_info: dict[str, str] = {}
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == "vllm:cache_config_info" and not cache_info:
                    cache_info = dict(s.labels)
                if s.name not in wanted:
                    continue
                if model is not None and s.labels.get("model_name", model) != model:
                    continue
                values[s.name] = values.get(s.name, 0.0) + float(s.value)
    except ValueError as exc:
        raise CalibrationError(f"/metrics is not Prometheus text: {exc}") from exc
    return MetricsSnapshot(values), cache_info


async def _get(session: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    try:
        async with session.get(url) as resp:
            return resp.status, await resp.text()
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise CalibrationError(f"cannot reach {url}: {exc or type(exc).__name__}") from exc


async def scrape(session: aiohttp.ClientSession, base: str, model: str) -> MetricsSnapshot:
    """Scrape ``base/metrics`` (samples of ``model``).

    Raises:
        CalibrationError: unreachable, or an answer other than 200.
    """
    status, text = await _get(session, f"{base}/metrics")
    if status != 200:
        raise CalibrationError(f"{base}/metrics answered {status}")
    return parse_metrics(text, model)[0]


def _int_label(info: dict[str, str], key: str, base: str) -> int:
    raw = info.get(key)
    try:
        value = int(str(raw))
    except ValueError:
        value = 0
    if value <= 0:
        raise CalibrationError(
            f"{base}/metrics: vllm:cache_config_info has no positive {key} (got {raw!r})"
        )
    return value


def _scheduler_limits(text: str) -> tuple[int | None, int | None]:
    """``max_num_seqs`` and ``max_num_batched_tokens`` from a ``/server_info`` JSON body."""
    try:
        data: Any = json.loads(text)
        sched = data["vllm_config"]["scheduler_config"]
        seqs, tokens = sched.get("max_num_seqs"), sched.get("max_num_batched_tokens")
    except (ValueError, KeyError, TypeError, AttributeError):
        return None, None
    return (
        seqs if isinstance(seqs, int) and seqs > 0 else None,
        tokens if isinstance(tokens, int) and tokens > 0 else None,
    )


async def read_server_info(
    session: aiohttp.ClientSession,
    url: str,
    *,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
) -> ServerInfo:
    """Read what ``url`` says of itself (module docstring lists the endpoints).

    Args:
        session: an open aiohttp session.
        url: the server's base URL.
        max_num_seqs, max_num_batched_tokens: the server's batch limits, used when
            ``/server_info`` does not give them (it answers only with
            ``VLLM_SERVER_DEV_MODE=1``); a value the server gives wins.

    Raises:
        CalibrationError: unreachable; ``/metrics`` missing or without
            ``vllm:cache_config_info`` (not a vLLM server); no model in ``/v1/models``; batch
            limits neither exposed nor given.
    """
    base = url.rstrip("/")
    status, text = await _get(session, f"{base}/metrics")
    if status != 200:
        raise CalibrationError(
            f"{base} is not a vLLM server: GET /metrics answered {status} (vLLM serves its "
            "Prometheus metrics there)"
        )
    _, cache_info = parse_metrics(text)
    if not cache_info:
        raise CalibrationError(
            f"{base} is not a vLLM server: /metrics has no vllm:cache_config_info"
        )
    block_size = _int_label(cache_info, "block_size", base)
    num_blocks = _int_label(cache_info, "num_gpu_blocks", base)
    status, text = await _get(session, f"{base}/v1/models")
    models: list[Any] = []
    if status == 200:
        try:
            body: Any = json.loads(text)
            models = list(body.get("data") or [])
        except (ValueError, AttributeError):
            models = []
    if not models or not isinstance(models[0], dict) or "id" not in models[0]:
        raise CalibrationError(f"{base}/v1/models lists no model (status {status})")
    model = str(models[0]["id"])
    max_len = models[0].get("max_model_len")
    if not isinstance(max_len, int) or max_len < 2:
        raise CalibrationError(f"{base}/v1/models gives no max_model_len for {model!r}")
    status, text = await _get(session, f"{base}/server_info?config_format=json")
    seqs, tokens = _scheduler_limits(text) if status == 200 else (None, None)
    limits_from = "server_info"
    if seqs is None or tokens is None:
        limits_from = "flags"
        seqs = seqs or max_num_seqs
        tokens = tokens or max_num_batched_tokens
        if seqs is None or tokens is None:
            raise CalibrationError(
                f"{base} does not expose its batch limits (/server_info needs "
                "VLLM_SERVER_DEV_MODE=1): pass --max-num-seqs and --max-num-batched-tokens "
                "as the server was started with"
            )
    status, text = await _get(session, f"{base}/version")
    version: str | None = None
    if status == 200:
        try:
            version = str(json.loads(text)["version"])
        except (ValueError, KeyError, TypeError):
            version = None
    return ServerInfo(
        url=base,
        model=model,
        block_size=block_size,
        num_gpu_blocks=num_blocks,
        max_model_len=max_len,
        max_num_seqs=seqs,
        max_num_batched_tokens=tokens,
        vllm_version=version,
        limits_from=limits_from,
        can_reset_cache=False,
    )
