"""Fitting the step-time model to what the probe phases measured.

Every phase gives one linear equation in the six constants ``TERMS``: its measured time (a mean
over requests, seconds) equals a sum of engine steps whose composition the phase design fixes
(:mod:`sessionroute.calibrate.plan`). The fit is a non-negative least squares on relative
errors (each equation divided by its measured value, so a 5 ms prefill weighs as much as a 3 s
churn): the exact solution, found by solving ordinary least squares (``numpy.linalg.lstsq``) on
every subset of the terms and keeping the best one whose constants are all ``>= 0`` (the NNLS
optimum is the least-squares solution on its own support; 64 subsets for 6 terms).

The weight-read time ``T_mem`` of the roofline is not fitted (a calibrated profile has
``w_dense_bytes = 0``): ``b0`` and ``b_seq`` absorb it, which is exact for a compute-bound
server (a CPU) and an approximation for a memory-bound GPU at small batches.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sessionroute.calibrate.probe import DECODE_HISTOGRAM, PhaseRun, RequestRecord, Round

__all__ = ["TERMS", "FitResult", "PhaseFit", "Row", "TermFit", "fit_rows", "phase_row"]

TERMS: tuple[str, ...] = ("b0_s", "b_tok_s", "b_seq_s", "b_req_s", "b_kv_s", "b_pa_s")
"""The fitted constants, as :class:`~sessionroute.replica.StepTimeProfile` fields."""

_SOURCE = {
    "prefill": "client TTFT",
    "cached": "client TTFT",
    "decode": "client first-to-last token",
    "churn": "wall time / requests",
}
_SERVER_SIDE = {
    "prefill": "vllm:time_to_first_token_seconds",
    "cached": "vllm:time_to_first_token_seconds",
    "decode": DECODE_HISTOGRAM,
}
"""The server's own histogram of what a phase measures at the client (shown beside it: the
difference is HTTP and the frontend's work)."""


@dataclass(frozen=True, slots=True)
class Row:
    """One equation: ``y = sum(x[i] * TERMS[i])``.

    Attributes:
        label: the phase it came from.
        kind: the phase kind.
        server: the server's URL.
        x: coefficients of :data:`TERMS` (steps, tokens, sequences, requests, context tokens,
            token^2), per request.
        y: measured seconds per request.
        source: what ``y`` is (measured at the client, or wall time).
        server_y: the server's own histogram of the same interval (median round), when it
            has one: the difference is HTTP and the frontend.
    """

    label: str
    kind: str
    server: str
    x: tuple[float, ...]
    y: float
    source: str
    server_y: float | None = None


@dataclass(frozen=True, slots=True)
class TermFit:
    """A fitted constant and its error.

    Attributes:
        name: the :data:`TERMS` field.
        value: the constant (seconds per unit).
        stderr: its standard error from the fit's residuals, or None when the constant sits at
            the bound 0 or the fit has no residual degrees of freedom.
        share: mean share of the predicted times that the term accounts for (0-1).
    """

    name: str
    value: float
    stderr: float | None
    share: float

    @property
    def rel_err(self) -> float | None:
        """``stderr / value``, None when undefined."""
        if self.stderr is None or self.value <= 0:
            return None
        return self.stderr / self.value

    def error_text(self, *, terse: bool = False) -> str:
        """The fit error in words, as ``calibrate`` and the fidelity run print it: the relative
        standard error (``"4.2%"``; terse: ``"±4%"``), ``"at bound 0"`` (terse: ``"at 0"``)
        for a constant at the bound, ``"?"`` when the fit has no residual degrees of freedom."""
        if self.value == 0:
            return "at 0" if terse else "at bound 0"
        rel = self.rel_err
        if rel is None:
            return "?"
        return f"±{rel:.0%}" if terse else f"{rel:.1%}"


@dataclass(frozen=True, slots=True)
class PhaseFit:
    """A phase's measured and predicted time.

    Attributes:
        label, kind, server, source: as in :class:`Row`.
        server_s: :attr:`Row.server_y`.
        measured_s: measured seconds per request.
        predicted_s: the fitted model's seconds per request.
    """

    label: str
    kind: str
    server: str
    source: str
    measured_s: float
    predicted_s: float
    server_s: float | None = None

    @property
    def error(self) -> float:
        """``predicted / measured - 1``."""
        return self.predicted_s / self.measured_s - 1.0


@dataclass(frozen=True, slots=True)
class FitResult:
    """The fitted constants, their errors, and each phase's error.

    Attributes:
        values: fitted constant by :data:`TERMS` name.
        terms: one per :data:`TERMS`.
        phases: one per equation.
    """

    values: dict[str, float]
    terms: tuple[TermFit, ...]
    phases: tuple[PhaseFit, ...]

    def rms_error(self, kind: str | None = None) -> float:
        """Root mean square of the phases' relative errors (of one kind, or all)."""
        errs = [p.error for p in self.phases if kind is None or p.kind == kind]
        return float(np.sqrt(np.mean(np.square(errs)))) if errs else 0.0


def _prefill_x(recs: Sequence[RequestRecord]) -> tuple[float, ...]:
    n = float(len(recs))
    p = [float(r.prompt_tokens - r.cached_tokens) for r in recs]
    a = [pi * (r.cached_tokens + pi / 2.0) for pi, r in zip(p, recs, strict=True)]
    return (1.0, sum(p) / n, 0.0, 1.0, 0.0, sum(a) / n)


def _decode_x(recs: Sequence[RequestRecord], b: float) -> tuple[float, ...]:
    cols = np.zeros(6)
    for r in recs:
        k = r.output_tokens - 1.0
        cols += k * np.array([1.0, b, b, 0.0, b * (r.prompt_tokens + r.output_tokens / 2), 0.0])
    return tuple(float(v) for v in cols / len(recs))


def _churn_totals(rnd: Round) -> np.ndarray:
    recs = rnd.records
    d = sum(r.output_tokens - 1.0 for r in recs)
    fresh = [float(r.prompt_tokens - r.cached_tokens) for r in recs]
    c = sum((r.output_tokens - 1.0) * (r.prompt_tokens + r.output_tokens / 2) for r in recs)
    attn = sum(pi * (r.cached_tokens + pi / 2.0) for pi, r in zip(fresh, recs, strict=True))
    return np.array([rnd.steps, sum(fresh) + d, d, float(len(recs)), c, attn])


def phase_row(run: PhaseRun) -> Row | None:
    """The equation of one phase run, or None when the server's histograms missed it.

    Per request with ``L`` prompt tokens of which ``H`` were cached (``P = L - H`` computed)
    and ``M`` output tokens (``shared/ENGINE.md``, "Step time"):

    - ``prefill``/``cached`` (time to first token: one step): ``[1, P, 0, 1, 0, P * (H + P /
      2)]``;
    - ``decode`` (first to last token: ``M - 1`` steps of ``B`` sequences):
      ``(M - 1) * [1, B, B, 0, B * (L + M / 2), 0]``;
    - ``churn`` (wall time, the server busy throughout): ``[steps, sum N, sum D, requests,
      sum C, sum A]`` over the phase, divided by its requests, with ``D = M - 1`` decode
      tokens and ``C = (M - 1) * (L + M / 2)`` context per request.

    ``prefill``, ``cached`` and ``decode`` take the median round's time (and the rounds' mean
    coefficients): measured at the client when the probe streamed, else vLLM's own histogram
    (``vllm:time_to_first_token_seconds``, ``vllm:request_decode_time_seconds``); ``churn``
    sums its rounds.
    """
    ph = run.phase
    kind = ph.kind
    rounds = [r for r in run.rounds if r.records]
    if kind == "churn":
        rounds = [r for r in rounds if r.steps > 0 and r.wall_s > 0]
        if not rounds:
            return None
        n = float(sum(len(r.records) for r in rounds))
        tot = sum((_churn_totals(r) for r in rounds), np.zeros(6))
        y = sum(r.wall_s for r in rounds) / n
        x = tuple(float(v) for v in tot / n)
        return Row(ph.label, kind, run.server, x, y, _SOURCE[kind])
    streamed = all(r.ttft_s is not None for rnd in rounds for r in rnd.records)
    # a streamed decode round whose tokens reached the client much faster than the server made
    # them measured the client's lag, not the steps: it is left out (all left out: the
    # server's own histogram instead)
    kept = [r for r in rounds if not (streamed and kind == "decode" and r.lagged)]
    client = streamed and bool(kept)
    ys: list[float] = []
    xs: list[tuple[float, ...]] = []
    servers: list[float] = []
    for rnd in kept or rounds:
        recs = rnd.records
        server_side = rnd.means.get(_SERVER_SIDE[kind])
        if not client:
            y_r = server_side or 0.0
        elif kind == "decode":
            y_r = statistics.fmean(r.decode_s or 0.0 for r in recs)
        else:
            y_r = statistics.fmean(r.ttft_s or 0.0 for r in recs)
        if y_r <= 0:
            continue
        ys.append(y_r)
        if server_side is not None:
            servers.append(server_side)
        if kind == "decode":
            xs.append(_decode_x(rnd.records, float(ph.concurrency)))
        else:
            xs.append(_prefill_x(rnd.records))
    if not ys:
        return None
    x_mean = tuple(float(v) for v in np.mean(np.array(xs), axis=0))
    server_y = float(np.median(servers)) if servers else None
    source = _SOURCE[kind] if client else _SERVER_SIDE[kind]
    return Row(ph.label, kind, run.server, x_mean, float(np.median(ys)), source, server_y)


def _nnls(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, tuple[int, ...]]:
    """Exact non-negative least squares for few columns: the best non-negative least-squares
    solution over every support. Returns the solution and its support."""
    m = a.shape[1]
    best: tuple[np.ndarray, tuple[int, ...]] = (np.zeros(m), ())
    best_rss = float(b @ b)
    for k in range(1, m + 1):
        for support in itertools.combinations(range(m), k):
            cols = list(support)
            sol, *_ = np.linalg.lstsq(a[:, cols], b, rcond=None)
            if np.any(sol < 0):
                continue
            rss = float(np.sum((a[:, cols] @ sol - b) ** 2))
            if rss < best_rss * (1 - 1e-12):
                full = np.zeros(m)
                full[cols] = sol
                best, best_rss = (full, support), rss
    return best


def fit_rows(rows: Sequence[Row]) -> FitResult:
    """Fit :data:`TERMS` to ``rows`` (non-negative, relative errors; module docstring).

    Raises:
        ValueError: no rows, or a row with ``y <= 0``.
    """
    if not rows:
        raise ValueError("no measurements to fit")
    if any(r.y <= 0 for r in rows):
        raise ValueError("every measured time must be > 0")
    x = np.array([r.x for r in rows], dtype=float)
    y = np.array([r.y for r in rows], dtype=float)
    a = x / y[:, None]  # relative errors: each equation divided by its measured value
    b = np.ones(len(rows))
    scale = np.linalg.norm(a, axis=0)
    scale[scale == 0] = 1.0
    sol, support = _nnls(a / scale, b)
    coef = sol / scale
    resid = a @ coef - b
    dof = len(rows) - len(support)
    stderr: dict[int, float] = {}
    if support and dof > 0:
        cols = list(support)
        j = a[:, cols]
        s2 = float(resid @ resid) / dof
        try:
            cov = s2 * np.linalg.inv(j.T @ j)
            stderr = {c: float(np.sqrt(max(cov[i, i], 0.0))) for i, c in enumerate(cols)}
        except np.linalg.LinAlgError:
            stderr = {}
    pred = x @ coef
    shares = (x * coef) / np.where(pred > 0, pred, 1.0)[:, None]
    terms = tuple(
        TermFit(name, float(coef[i]), stderr.get(i), float(np.mean(shares[:, i])))
        for i, name in enumerate(TERMS)
    )
    phases = tuple(
        PhaseFit(r.label, r.kind, r.server, r.source, r.y, float(pred[i]), r.server_y)
        for i, r in enumerate(rows)
    )
    return FitResult({name: float(coef[i]) for i, name in enumerate(TERMS)}, terms, phases)
