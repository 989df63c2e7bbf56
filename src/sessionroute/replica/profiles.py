"""Step-time profiles of the replica model (``shared/ENGINE.md``, section "Step time").

One engine step that schedules ``P`` uncached prefill tokens and ``D`` decoding sequences
(``N = P + D``), whose decoding sequences hold ``C`` context tokens in total and whose prefill
chunks have attention work ``A = sum(chunk * (tokens already in KV + chunk / 2))``, and which
admits ``R`` new requests (scheduled for the first time), takes::

    t_step = b0 + max(T_mem(N), b_tok * N) + b_seq * D + b_req * R + b_kv * C + b_pa * A
    T_mem(N) = (W_dense + W_exp * (1 - (1 - k/E) ** N)) / BW_eff

seconds. ``max(T_mem, b_tok * N)`` is the weight-bound / compute-bound roofline (MoE expert
coverage for ``T_mem``), ``b_seq * D`` the per-sequence cost of a decode step beyond its token
(sampling, detokenising and streaming each sequence's token), ``b_req * R`` the per-request
overhead of a new request (input processing, request setup, its response), ``b_kv * C`` decode
attention over the KV cache, ``b_pa * A`` prefill attention over a cached prefix. Constants of
the two built-in profiles come from the table in ``ENGINE.md`` (public model shapes, H100/H200
datasheets, GPUStack and BLIS/inference-sim fits); their ``b_seq`` and ``b_req`` are 0. The two
terms were added when fitting real vLLM servers (``sessionroute calibrate``,
:mod:`sessionroute.calibrate`) showed them missing; a calibrated profile fits them.
"""

from __future__ import annotations

import dataclasses
import json
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sessionroute.errors import ConfigError

__all__ = [
    "PROFILES",
    "ProfileFile",
    "StepTimeProfile",
    "is_profile_path",
    "load_profile_file",
    "load_profiles",
]


@dataclass(frozen=True, slots=True)
class StepTimeProfile:
    """Constants of the step-time model for one model on one hardware/parallelism setup.

    Attributes:
        name: profile name, e.g. ``"glm45air-h200-tp8"``.
        b0_s: fixed per-step overhead, seconds.
        b_tok_s: compute cost per scheduled token, seconds.
        b_kv_s: decode attention cost per context token of a decoding sequence, seconds.
        b_pa_s: prefill attention cost per unit of ``A`` (token x token), seconds.
        w_dense_bytes: dense (always read) weight bytes per GPU.
        w_exp_bytes: routed-expert weight bytes per GPU (0 for a dense model).
        k_over_e: active experts over total experts (``k/E``); irrelevant when
            ``w_exp_bytes == 0``.
        bw_eff_bytes_per_s: effective HBM bandwidth per GPU, bytes per second.
        kv_capacity_tokens: KV cache capacity of the replica, tokens.
        max_num_batched_tokens: vLLM ``max_num_batched_tokens`` (token budget per step).
        max_num_seqs: vLLM ``max_num_seqs`` (running requests at most).
        max_model_len: vLLM ``max_model_len`` (prompt + output tokens at most).
        b_seq_s: per decoding sequence cost of a step beyond ``b_tok``, seconds (0: none).
        b_req_s: per-request overhead, charged to the step that first schedules a request,
            seconds (0: none).
        path_delay_s: the delay a request sees on its way to the engine outside the engine's
            queue and prefill (client, router, HTTP, chat template, the server's frontend)
            beyond what the step terms hold, seconds; the simulator adds it to the request's
            trip to its replica (0: none). Not a step term: it occupies no engine.
        path_delay_per_request_s: how much that delay grows per other request in flight (the
            turns the clients have sent and not yet been answered), seconds (0: constant).
        path_delay_curve: ``(in_flight, delay_s)`` points (``in_flight`` increasing) that
            :meth:`path_delay` interpolates instead of the line above, held at its first and
            last values outside them; empty: the line (``sessionroute.calibrate.path``). A
            profile file's table that sets the line without a curve drops its base's curve.
        path_step_factor: factor on every step time of a replica that shares its host with
            no busy replica (1: none): what the arms' request path (router, chat template,
            streamed responses through every process on the host) makes of the step times the
            calibration measured straight at the servers. The simulator only.
        peer_busy_slowdown: how much a replica's steps slow down per other replica busy at the
            same time (a request in its engine), as a fraction: each step takes
            ``path_step_factor * (1 + peer_busy_slowdown * busy_others)`` times the step
            terms (0: replicas do not share a host's cores). Servers on one CPU host, whose
            engines, frontends, router and clients take turns on the same cores; fitted by
            ``compare --fidelity``'s path probe (``sessionroute.calibrate.host``). The
            simulator only.
    """

    name: str
    b0_s: float
    b_tok_s: float
    b_kv_s: float
    b_pa_s: float
    w_dense_bytes: float
    w_exp_bytes: float
    k_over_e: float
    bw_eff_bytes_per_s: float
    kv_capacity_tokens: int
    max_num_batched_tokens: int
    max_num_seqs: int
    max_model_len: int
    b_seq_s: float = 0.0
    b_req_s: float = 0.0
    path_delay_s: float = 0.0
    path_delay_per_request_s: float = 0.0
    path_delay_curve: tuple[tuple[float, float], ...] = ()
    path_step_factor: float = 1.0
    peer_busy_slowdown: float = 0.0

    def host_factor(self, busy_others: int) -> float:
        """Factor on the step terms of a replica with ``busy_others`` other replicas busy
        (``path_step_factor * (1 + peer_busy_slowdown * busy_others)``)."""
        return self.path_step_factor * (1.0 + self.peer_busy_slowdown * busy_others)

    def path_delay(self, in_flight: int) -> float:
        """The path delay of a request sent with ``in_flight`` other requests in flight,
        seconds: the curve interpolated where there is one, else the line."""
        return path_delay_at(
            self.path_delay_curve, self.path_delay_s, self.path_delay_per_request_s, in_flight
        )

    def t_mem(self, num_tokens: int) -> float:
        """Weight-read time ``T_mem(N)`` in seconds for ``num_tokens`` tokens in the step."""
        # math.pow with a float exponent: the same libm pow() that ``float ** int`` calls
        cover = 1.0 - math.pow(1.0 - self.k_over_e, float(num_tokens)) if self.w_exp_bytes else 0.0
        return (self.w_dense_bytes + self.w_exp_bytes * cover) / self.bw_eff_bytes_per_s

    def step_time(
        self,
        prefill_tokens: int,
        decode_seqs: int,
        decode_context_tokens: int,
        prefill_attention: float,
        new_requests: int = 0,
    ) -> float:
        """Duration of one engine step, seconds.

        Args:
            prefill_tokens: ``P``, uncached prefill tokens scheduled in the step.
            decode_seqs: ``D``, decoding sequences in the step (one token each).
            decode_context_tokens: ``C``, sum of the decoding sequences' context lengths.
            prefill_attention: ``A``, sum over prefill chunks of
                ``chunk * (tokens already in KV + chunk / 2)`` (token^2).
            new_requests: ``R``, requests scheduled for the first time in the step.

        Returns:
            ``b0 + max(T_mem(N), b_tok * N) + b_seq * D + b_req * R + b_kv * C + b_pa * A``
            with ``N = P + D``, summed in that order (with ``b_seq = b_req = 0`` the two terms
            add exactly 0.0: the built-in profiles' step times are unchanged to the bit).
        """
        n = prefill_tokens + decode_seqs
        compute = self.b_tok_s * n
        mem = self.t_mem(n)
        return (
            self.b0_s
            + (mem if mem > compute else compute)
            + self.b_seq_s * decode_seqs
            + self.b_req_s * new_requests
            + self.b_kv_s * decode_context_tokens
            + self.b_pa_s * prefill_attention
        )


PROFILES: dict[str, StepTimeProfile] = {
    "glm45air-h200-tp8": StepTimeProfile(
        name="glm45air-h200-tp8",
        b0_s=4.5e-3,
        b_tok_s=16e-6,
        b_kv_s=7.0e-9,
        b_pa_s=0.7e-9,
        w_dense_bytes=1.5e9,
        w_exp_bytes=24.9e9,
        k_over_e=8 / 128,
        bw_eff_bytes_per_s=3.36e12,
        kv_capacity_tokens=4_400_000,
        max_num_batched_tokens=8192,
        max_num_seqs=1024,
        max_model_len=131072,
    ),
    "toy-8b-h100-tp1": StepTimeProfile(
        name="toy-8b-h100-tp1",
        b0_s=1.0e-3,
        b_tok_s=20e-6,
        b_kv_s=56e-9,
        b_pa_s=1.3e-9,
        w_dense_bytes=16e9,
        w_exp_bytes=0.0,
        k_over_e=1.0,
        bw_eff_bytes_per_s=2.35e12,
        kv_capacity_tokens=447_000,
        max_num_batched_tokens=8192,
        max_num_seqs=256,
        max_model_len=32768,
    ),
}
"""Built-in profiles of ``ENGINE.md``: ``glm45air-h200-tp8`` and ``toy-8b-h100-tp1``."""


def interpolate(curve: tuple[tuple[float, float], ...], x: float) -> float:
    """``curve``'s value at ``x``: linear between its points (``x`` increasing), its first
    value before the first point and its last after the last one."""
    if x <= curve[0][0]:
        return curve[0][1]
    for i in range(1, len(curve)):
        x1, y1 = curve[i]
        if x <= x1:
            x0, y0 = curve[i - 1]
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0) if x1 > x0 else y1
    return curve[-1][1]


def path_delay_at(
    curve: tuple[tuple[float, float], ...], d0_s: float, d1_s: float, in_flight: float
) -> float:
    """The request path's delay with ``in_flight`` other requests in flight, seconds:
    ``curve`` interpolated (:func:`interpolate`) where it has points, else ``d0_s + d1_s *
    in_flight`` (the one rule of a profile's and a path fit's delay:
    :meth:`StepTimeProfile.path_delay`, ``sessionroute.calibrate.path.PathFit.delay_s``)."""
    if curve:
        return interpolate(curve, in_flight)
    return d0_s + d1_s * in_flight


_FIELDS = {f.name: f for f in dataclasses.fields(StepTimeProfile)}
_OPTIONAL_FIELDS = {
    "b_seq_s",
    "b_req_s",
    "path_delay_s",
    "path_delay_per_request_s",
    "path_delay_curve",
    "path_step_factor",
    "peer_busy_slowdown",
}
_INT_FIELDS = {"kv_capacity_tokens", "max_num_batched_tokens", "max_num_seqs", "max_model_len"}


def _curve(name: str, value: Any) -> tuple[tuple[float, float], ...]:
    """A ``path_delay_curve``: a list of ``[in_flight, delay_s]`` pairs, both >= 0, in_flight
    increasing (empty: none)."""
    err = ConfigError(
        f"profile {name!r}: path_delay_curve must be a list of [in_flight, delay_s] pairs of "
        f"numbers >= 0 with in_flight increasing, got {value!r}"
    )
    if not isinstance(value, list):
        raise err
    points: list[tuple[float, float]] = []
    for pair in value:
        if not isinstance(pair, list | tuple) or len(pair) != 2:
            raise err
        if any(isinstance(v, bool) or not isinstance(v, int | float) or v < 0 for v in pair):
            raise err
        if points and float(pair[0]) <= points[-1][0]:
            raise err
        points.append((float(pair[0]), float(pair[1])))
    return tuple(points)


def _profile_from_table(
    name: str, table: dict[str, Any], known: dict[str, StepTimeProfile]
) -> StepTimeProfile:
    values: dict[str, Any] = {}
    base_name = table.get("base")
    if base_name is not None:
        if base_name not in known:
            raise ConfigError(f"profile {name!r}: unknown base profile {base_name!r}")
        values = dataclasses.asdict(known[base_name])
    for key, value in table.items():
        if key == "base":
            continue
        if key not in _FIELDS or key == "name":
            raise ConfigError(f"profile {name!r}: unknown key {key!r}")
        if key == "path_delay_curve":
            values[key] = _curve(name, value)
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"profile {name!r}: {key} must be a number, got {value!r}")
        if key in _INT_FIELDS and int(value) != value:
            raise ConfigError(f"profile {name!r}: {key} must be an integer, got {value!r}")
        if value < 0:
            raise ConfigError(f"profile {name!r}: {key} must be >= 0, got {value!r}")
        values[key] = int(value) if key in _INT_FIELDS else float(value)
    values["name"] = name
    if "path_delay_curve" not in table and {"path_delay_s", "path_delay_per_request_s"} & set(
        table
    ):
        values.pop("path_delay_curve", None)  # the line given here replaces the base's curve
    missing = sorted(set(_FIELDS) - set(values) - _OPTIONAL_FIELDS)
    if missing:
        raise ConfigError(f"profile {name!r}: missing keys {missing} (or give base = '<name>')")
    for key in ("bw_eff_bytes_per_s", "path_step_factor", *_INT_FIELDS):
        if values.get(key, 1) <= 0:
            raise ConfigError(f"profile {name!r}: {key} must be > 0, got {values[key]!r}")
    return StepTimeProfile(**values)


def load_profiles(path: str | Path) -> dict[str, StepTimeProfile]:
    """Read user-defined profiles from a TOML or JSON file (chosen by the suffix).

    The file holds one table per profile, either at top level or under ``profiles``::

        [profiles.my-gpu]
        base = "toy-8b-h100-tp1"     # optional: start from a built-in or earlier profile
        b0_s = 0.002
        kv_capacity_tokens = 128000

    Keys are the fields of :class:`StepTimeProfile` (except ``name``, which is the table name).

    Args:
        path: a ``.toml`` or ``.json`` file.

    Returns:
        The built-in profiles updated with the file's profiles, by name.

    Raises:
        ConfigError: unreadable file, unknown key, non-numeric or negative value, missing key.
    """
    p = Path(path)
    try:
        text = p.read_text()
        data: Any = json.loads(text) if p.suffix.lower() == ".json" else tomllib.loads(text)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read profiles from {str(p)!r}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"profiles file {str(p)!r} must hold a table of profiles")
    tables = data.get("profiles", data)
    if not isinstance(tables, dict):
        raise ConfigError(f"profiles file {str(p)!r}: 'profiles' must be a table")
    out = dict(PROFILES)
    for name, table in tables.items():
        if not isinstance(table, dict):
            raise ConfigError(f"profiles file {str(p)!r}: profile {name!r} must be a table")
        out[name] = _profile_from_table(name, table, out)
    return out


@dataclass(frozen=True, slots=True)
class ProfileFile:
    """One profile read from a file, with the server settings recorded beside it.

    Attributes:
        profile: the step-time profile (its KV capacity, ``max_num_seqs``,
            ``max_num_batched_tokens`` and ``max_model_len`` are the server's).
        block_size: the server's KV block size in tokens (``[calibration] block_size``), or
            None when the file does not record one.
        calibration: the file's ``[calibration]`` table (server, date, fit errors), empty when
            it has none.
    """

    profile: StepTimeProfile
    block_size: int | None
    calibration: dict[str, Any]


def is_profile_path(value: str) -> bool:
    """Whether a ``[replicas] profile`` value names a file (``.toml``/``.json``) rather than a
    profile name."""
    return value.lower().endswith((".toml", ".json"))


def load_profile_file(path: str | Path) -> ProfileFile:
    """Read the one profile of a profile file, e.g. one written by ``sessionroute calibrate``.

    The file is read as :func:`load_profiles` reads it; it must define exactly one profile, or
    name one with ``[calibration] profile = "<name>"``. ``[calibration] block_size`` (tokens),
    when present, is the server's KV block size.

    Args:
        path: a ``.toml`` or ``.json`` file.

    Raises:
        ConfigError: what :func:`load_profiles` raises; no profile or several without
            ``[calibration] profile``; a ``block_size`` that is not a positive integer.
    """
    p = Path(path)
    profiles = load_profiles(p)
    text = p.read_text()
    data: Any = json.loads(text) if p.suffix.lower() == ".json" else tomllib.loads(text)
    calib = data.get("calibration", {})
    if not isinstance(calib, dict):
        raise ConfigError(f"profile file {str(p)!r}: 'calibration' must be a table")
    own = [name for name in profiles if name not in PROFILES or profiles[name] != PROFILES[name]]
    wanted = calib.get("profile")
    if wanted is not None:
        if wanted not in profiles:
            raise ConfigError(f"profile file {str(p)!r}: no profile {wanted!r} in the file")
        name = str(wanted)
    elif len(own) == 1:
        name = own[0]
    else:
        raise ConfigError(
            f"profile file {str(p)!r} defines {len(own)} profiles ({', '.join(own) or 'none'});"
            " name one with [calibration] profile = '<name>'"
        )
    bs = calib.get("block_size")
    if bs is not None and (isinstance(bs, bool) or not isinstance(bs, int) or bs <= 0):
        raise ConfigError(
            f"profile file {str(p)!r}: calibration.block_size must be a positive"
            f" integer, got {bs!r}"
        )
    return ProfileFile(profiles[name], bs, dict(calib))
