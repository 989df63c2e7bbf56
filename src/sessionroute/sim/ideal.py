"""The simulator's bound on work at ideal reuse (``ideal_busy_seconds``; the hit-rate bound is
:class:`~sessionroute.record.ideal.IdealCache`, shared with live arms).

* ``ideal_busy_seconds``: the compute terms of the step-time model (``shared/ENGINE.md``) at
  ideal reuse, summed over requests and divided evenly over the replicas: per request
  ``b_tok * (P + O) + b_pa * P * (H + P / 2) + b_kv * O * (L + (O - 1) / 2)`` with ``L``
  prompt tokens, ``H`` ideal hit tokens, ``P = L - H`` and ``O`` output tokens. The per-step
  overhead ``b0`` and the weight-read time (which batching shares) are left out, so it is a
  lower bound. Only the simulator knows the step-time model, so a live arm reports None.
"""

from __future__ import annotations

from sessionroute.replica import StepTimeProfile

__all__ = ["ideal_work_s"]


def ideal_work_s(profile: StepTimeProfile, prompt_len: int, hit: int, output_len: int) -> float:
    """Compute-term seconds of one request at ideal reuse (see the module docstring)."""
    p = prompt_len - hit
    o = output_len
    return (
        profile.b_tok_s * (p + o)
        + profile.b_pa_s * p * (hit + p / 2.0)
        + profile.b_kv_s * o * (prompt_len + (o - 1) / 2.0)
    )
