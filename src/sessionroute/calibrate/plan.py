"""The probe plan of ``sessionroute calibrate``: which requests each phase sends.

Each phase isolates terms of the step-time model (``sessionroute.replica.profiles``)::

    t_step = b0 + b_tok * N + b_seq * D + b_req * R + b_kv * C + b_pa * A

- ``prefill``: one request at a time, ``L`` fresh prompt tokens, 1 output token. Its TTFT is
  one step: ``b0 + b_tok * L + b_req + b_pa * L^2 / 2``.
- ``cached``: one at a time, a cached prefix of ``H`` tokens plus ``S`` fresh ones: ``b0 +
  b_tok * S + b_req + b_pa * S * (H + S / 2)``; with ``prefill`` it separates ``b_tok`` from
  ``b_pa``.
- ``decode``: ``B`` requests together on a cached prefix of ``H`` tokens, ``M`` output tokens
  each; a request's decode time is ``M - 1`` steps of ``b0 + (b_tok + b_seq) * B + b_kv * C``.
  Several ``B`` and ``H`` separate ``b0``, ``b_seq`` and ``b_kv``.
- ``churn``: a closed loop of ``c`` requests in flight with varied prompt and output lengths, so
  that requests arrive and finish while others decode (as in a real workload); the server is
  busy throughout, so the phase's wall time is the sum of its steps, whose count
  (``vllm:iteration_tokens_total``) and token totals are known. It weighs the per-request
  overhead ``b_req`` in situ. A second ``churn`` of long prompts (``Lcap / 4`` to ``Lcap / 2``
  fresh tokens) weighs the prefill and context terms where long prompts arrive while others
  decode, each request on its own context: several prefills at once, mixed with decode steps,
  as a KV-pressure workload runs them.
"""

from __future__ import annotations

from dataclasses import dataclass

from sessionroute.calibrate.server import ServerInfo

__all__ = ["DECODE_TOKENS", "PHASE_KINDS", "Phase", "ProbePlan", "default_plan"]

PHASE_KINDS: tuple[str, ...] = ("prefill", "cached", "decode", "churn")
"""Phase kinds, in the order a plan runs them."""

DECODE_TOKENS = 48
"""Output tokens of a ``decode`` request in the default plan (``sessionroute calibrate
--decode-tokens``)."""


@dataclass(frozen=True, slots=True)
class Phase:
    """One probe phase.

    Attributes:
        kind: one of :data:`PHASE_KINDS`.
        fresh_tokens: fresh (uncached) prompt tokens per request; ``churn`` draws each
            request's between ``fresh_min`` and this.
        prefix_tokens: shared prefix, warmed before the phase so that it is cached (a multiple
            of the block size; 0 for ``prefill``).
        output_tokens: ``max_tokens`` per request (``ignore_eos``); ``churn`` draws each
            request's between ``output_min`` and this.
        concurrency: requests in flight at once.
        requests: requests per round.
        fresh_min: smallest fresh prompt of a ``churn`` request (else equal to
            ``fresh_tokens``).
        output_min: smallest output of a ``churn`` request (else equal to ``output_tokens``).
        rounds: rounds of ``requests`` requests, each measured on its own (the fit takes the
            median round of ``prefill``, ``cached`` and ``decode``, robust to a noisy
            neighbour; ``churn`` sums its rounds).
    """

    kind: str
    fresh_tokens: int
    prefix_tokens: int
    output_tokens: int
    concurrency: int
    requests: int
    fresh_min: int
    output_min: int
    rounds: int = 1

    @property
    def label(self) -> str:
        """A short name, e.g. ``decode B=4 H=1536``."""
        if self.kind == "prefill":
            return f"prefill L={self.fresh_tokens}"
        if self.kind == "cached":
            return f"cached H={self.prefix_tokens} S={self.fresh_tokens}"
        if self.kind == "decode":
            return f"decode B={self.concurrency} H={self.prefix_tokens}"
        return f"churn c={self.concurrency} L={self.fresh_min}-{self.fresh_tokens}"

    def describe(self) -> str:
        """One line of ``--dry-run``: what the phase sends."""
        rounds = f"{self.rounds} x " if self.rounds > 1 else ""
        if self.kind == "churn":
            return (
                f"{rounds}{self.requests} requests, {self.concurrency} in flight (closed loop), "
                f"prefix {self.prefix_tokens} cached + {self.fresh_min}-{self.fresh_tokens} "
                f"fresh tokens, {self.output_min}-{self.output_tokens} output tokens"
            )
        together = "" if self.concurrency == 1 else " together"
        prefix = f"prefix {self.prefix_tokens} cached + " if self.prefix_tokens else ""
        n = f"{self.requests} requests" if self.requests > 1 else "1 request"
        return (
            f"{rounds}{n}{together}, {prefix}{self.fresh_tokens} fresh tokens, "
            f"{self.output_tokens} output tokens"
        )


@dataclass(frozen=True, slots=True)
class ProbePlan:
    """The phases run against each server, and the seed of their token ids.

    Attributes:
        phases: in run order.
        seed: seed of the prompts' token ids.
        stream: send streaming requests and fit times measured at the client (as a streaming
            client sees them, the frontend's per-token work included); False sends plain
            requests and fits vLLM's own histograms (for workloads that do not stream).
    """

    phases: tuple[Phase, ...]
    seed: int = 0
    stream: bool = True

    @property
    def num_requests(self) -> int:
        """Requests the plan sends to one server (prefix warm-ups included)."""
        warm = sum(1 for p in self.phases if p.prefix_tokens)
        return warm + sum(p.requests * p.rounds for p in self.phases)


def _blocks_down(tokens: int, block_size: int) -> int:
    return max(block_size, tokens // block_size * block_size)


def default_plan(
    info: ServerInfo, *, reps: int = 7, decode_tokens: int = DECODE_TOKENS, stream: bool = True
) -> ProbePlan:
    """The plan sized to one server's limits.

    Prompt lengths go up to ``Lcap = min(max_num_batched_tokens, max_model_len - 2, KV / 4)``
    so that every prefill is one step; decode batches go up to ``max_num_seqs`` within the KV
    cache.

    Args:
        info: the server (its block size, KV capacity and limits).
        reps: rounds of each phase (``churn``: ``max(1, reps // 2)``).
        decode_tokens: output tokens of a ``decode`` request (``churn``: at most this).
        stream: :attr:`ProbePlan.stream`.

    Raises:
        ValueError: ``reps`` or ``decode_tokens`` below 1, or a server too small to probe
            (``Lcap`` under two blocks).
    """
    if reps < 1 or decode_tokens < 2:
        raise ValueError(f"reps must be >= 1 and decode_tokens >= 2, got {reps}, {decode_tokens}")
    bs = info.block_size
    kv = info.kv_capacity_tokens
    cap = min(info.max_num_batched_tokens, info.max_model_len - 2, kv // 4)
    if cap < 2 * bs:
        raise ValueError(
            f"{info.url}: too small to probe (max_num_batched_tokens "
            f"{info.max_num_batched_tokens}, max_model_len {info.max_model_len}, KV {kv} tokens)"
        )
    phases: list[Phase] = []
    lengths = sorted({max(8, int(cap * f)) for f in (1 / 32, 1 / 8, 1 / 4, 1 / 2, 1.0)})
    for n in lengths:
        phases.append(Phase("prefill", n, 0, 1, 1, 1, n, 1, reps))
    h_big = _blocks_down(cap * 3 // 4, bs)
    for h, s in sorted({(h_big, 8), (h_big, max(8, cap // 8)), (_blocks_down(cap // 4, bs), 8)}):
        if h + s <= cap:
            phases.append(Phase("cached", s, h, 1, 1, 1, s, 1, reps))
    m = decode_tokens
    fresh = min(16, bs)
    s_max = info.max_num_seqs
    batches = sorted({1, max(2, s_max // 4), s_max})
    h_dec = _blocks_down(min(cap, info.max_model_len - fresh - m - 2) * 3 // 4, bs)
    for h in sorted({2 * bs, h_dec}):
        for b in batches:
            per_req = -(-(fresh + m) // bs) + 1
            b_fit = min(b, max(1, (kv // bs - h // bs - 1) // per_req))
            phases.append(Phase("decode", fresh, h, m, b_fit, b_fit, fresh, m, reps))
    churn_prefix = 2 * bs
    churn_fresh = max(8, min(cap // 8, info.max_model_len - churn_prefix - m - 2))
    for c in sorted({max(2, s_max // 4), s_max}):
        per_req = -(-(churn_fresh + m) // bs) + 1
        c_fit = min(c, max(1, (kv // bs - churn_prefix // bs - 1) // per_req))
        phases.append(
            Phase(
                "churn",
                churn_fresh,
                churn_prefix,
                m,
                c_fit,
                3 * c_fit,
                8,
                max(2, m // 4),
                max(1, reps // 2),
            )
        )
    long_hi = max(8, min(cap // 2, info.max_model_len - churn_prefix - m - 2))
    long_lo = max(8, min(cap // 4, long_hi))
    if long_hi > churn_fresh:
        per_req = -(-(long_hi + m) // bs) + 1
        c_long = min(max(2, s_max // 4), max(1, (kv // bs - churn_prefix // bs - 1) // per_req))
        phases.append(
            Phase(
                "churn",
                long_hi,
                churn_prefix,
                m,
                c_long,
                3 * c_long,
                long_lo,
                max(2, m // 4),
                max(1, reps // 2),
            )
        )
    unique = list(dict.fromkeys(phases))
    return ProbePlan(tuple(unique), stream=stream)
