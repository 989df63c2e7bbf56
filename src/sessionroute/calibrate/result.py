"""A calibration's result and the profile file it writes.

The file is a profiles file that :func:`sessionroute.replica.load_profiles` reads (one
``[profiles.NAME]`` table) plus a ``[calibration]`` table that records where the constants came
from; ``[replicas] profile = "path/to/profile.toml"`` in an experiment file loads it
(:func:`sessionroute.replica.load_profile_file`), block size included::

    [profiles.calibrated-tiny]
    b0_s = 0.0031
    b_tok_s = 1.2e-05
    ...
    kv_capacity_tokens = 32768
    max_num_seqs = 16

    [calibration]
    profile = "calibrated-tiny"
    block_size = 32
    date = "2026-12-06T08:40:00+00:00"
    servers = [{url = "http://127.0.0.1:8001", model = "tiny", ...}]

    [calibration.fit_error]        # relative standard error of each constant
    b0_s = 0.04
    ...
"""

from __future__ import annotations

import dataclasses
import json
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w

from sessionroute.calibrate.fit import FitResult
from sessionroute.calibrate.path import PathFit
from sessionroute.calibrate.plan import ProbePlan
from sessionroute.calibrate.probe import PhaseRun
from sessionroute.calibrate.server import ServerInfo
from sessionroute.replica import StepTimeProfile, load_profile_file

__all__ = ["CalibrationResult", "host_fields", "profile_name", "write_path", "write_profile"]

_BW_PLACEHOLDER = 1e12
"""``bw_eff_bytes_per_s`` of a calibrated profile: any positive value (``w_dense_bytes`` is 0,
so ``T_mem`` is 0 whatever it is)."""


@dataclass(frozen=True, slots=True)
class CalibrationResult:
    """What ``calibrate`` measured and fitted.

    Attributes:
        profile: the fitted profile, with the servers' KV capacity (the smallest), batch
            limits and ``max_model_len``.
        block_size: the servers' KV block size, tokens.
        servers: what each server said of itself.
        plan: the probe plan that ran.
        runs: every phase run, in order (servers one after the other).
        fit: the fitted constants, their errors and each phase's error.
        date: when the calibration finished (ISO 8601, UTC).
        wall_s: how long it took, seconds.
        probe: how the servers were probed (``calibrate``'s ``probe``; ``"first"`` when one
            server was).
        path: the request path's delay as the arms' path measured it (``compare
            --fidelity``, :meth:`with_path`), or None (then the profile has none).
        host_loop_ms: the host's speed while calibrating, where ``compare --fidelity``
            measured it (:mod:`sessionroute.experiments.live.hostspeed`: a fixed loop's median
            CPU milliseconds; a later run on the profile compares its own with it), or None.
    """

    profile: StepTimeProfile
    block_size: int
    servers: tuple[ServerInfo, ...]
    plan: ProbePlan
    runs: tuple[PhaseRun, ...]
    fit: FitResult
    date: str
    wall_s: float
    probe: str = "first"
    path: PathFit | None = None
    host_loop_ms: float | None = None

    def with_path(self, path: PathFit) -> CalibrationResult:
        """This result with the path delay ``path`` in its profile (``path_delay_s``,
        ``path_delay_per_request_s``, ``path_delay_curve``, and the host's sharing:
        :func:`host_fields`) and in its ``[calibration.path]`` table."""
        host = host_fields(path)
        profile = dataclasses.replace(
            self.profile,
            path_delay_s=path.d0_s,
            path_delay_per_request_s=path.d1_s,
            path_delay_curve=path.curve,
            path_step_factor=host["path_step_factor"],
            peer_busy_slowdown=host["peer_busy_slowdown"],
        )
        return dataclasses.replace(self, profile=profile, path=path)

    def calibration_table(self) -> dict[str, Any]:
        """The ``[calibration]`` table of the profile file."""
        fit = self.fit
        return {
            "profile": self.profile.name,
            "block_size": self.block_size,
            "date": self.date,
            "wall_s": round(self.wall_s, 1),
            "tool": "sessionroute calibrate",
            "probe": self.probe,
            **({"host_loop_ms": self.host_loop_ms} if self.host_loop_ms is not None else {}),
            "model_terms": "t_step = b0 + b_tok*N + b_seq*D + b_req*R + b_kv*C + b_pa*A "
            "(T_mem not fitted: w_dense_bytes = 0)",
            "servers": [
                {
                    "url": s.url,
                    "model": s.model,
                    "vllm_version": s.vllm_version or "unknown",
                    "block_size": s.block_size,
                    "num_gpu_blocks": s.num_gpu_blocks,
                    "kv_capacity_tokens": s.kv_capacity_tokens,
                    "max_num_seqs": s.max_num_seqs,
                    "max_num_batched_tokens": s.max_num_batched_tokens,
                    "max_model_len": s.max_model_len,
                    "limits_from": s.limits_from,
                    "reset_prefix_cache": s.can_reset_cache,
                }
                for s in self.servers
            ],
            "fit_error": {
                t.name: (-1.0 if t.rel_err is None else round(t.rel_err, 4)) for t in fit.terms
            },
            "fit_error_note": "relative standard error of each constant (-1: at the bound 0 "
            "or undetermined)",
            "phase_rms_error": {
                kind: round(fit.rms_error(kind), 4)
                for kind in dict.fromkeys(p.kind for p in fit.phases)
            },
            "phases": [
                {
                    "phase": p.label,
                    "measured": p.source,
                    "measured_s": round(p.measured_s, 6),
                    "predicted_s": round(p.predicted_s, 6),
                    "error": round(p.error, 4),
                    **({} if p.server_s is None else {"vllm_histogram_s": round(p.server_s, 6)}),
                }
                for p in fit.phases
            ],
            **({} if self.path is None else {"path": self.path.table()}),
        }


def profile_name(model: str) -> str:
    """The profile name for a served model: ``calibrated-<model>`` with unsafe characters
    replaced by ``-``."""
    return "calibrated-" + (re.sub(r"[^A-Za-z0-9_.-]+", "-", model).strip("-") or "model")


def write_profile(result: CalibrationResult, path: str | Path) -> Path:
    """Write ``result`` as a profile file (module docstring) and return its path.

    Raises:
        OSError: the file cannot be written.
    """
    p = Path(path)
    prof = dataclasses.asdict(result.profile)
    name = prof.pop("name")
    curve = prof.pop("path_delay_curve")
    if curve:
        prof["path_delay_curve"] = [list(point) for point in curve]
    doc = {"profiles": {name: prof}, "calibration": result.calibration_table()}
    header = (
        f"# Step-time profile fitted by `sessionroute calibrate` on {result.date}.\n"
        f'# Use it with  [replicas] profile = "{p}"  in an experiment file.\n'
    )
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(header + tomli_w.dumps(doc))
    return p


def host_fields(path: PathFit) -> dict[str, float]:
    """The profile's ``path_step_factor`` and ``peer_busy_slowdown`` from ``path``'s host fit
    (1 and 0 without one: a profile's earlier fit goes with its earlier path table)."""
    host = path.host
    if host is None:
        return {"path_step_factor": 1.0, "peer_busy_slowdown": 0.0}
    return {
        "path_step_factor": host.path_step_factor,
        "peer_busy_slowdown": host.peer_busy_slowdown,
    }


def write_path(source: str | Path, path: PathFit, dest: str | Path) -> Path:
    """Copy the profile file ``source`` to ``dest`` (TOML) with the path delay ``path`` in its
    profile (``path_delay_s``, ``path_delay_per_request_s``, ``path_delay_curve`` where it has
    one, and the host's sharing: :func:`host_fields`) and its ``[calibration.path]`` table;
    returns ``dest``.

    Raises:
        ConfigError: ``source`` is not a profile file (:func:`load_profile_file`).
        OSError: a file cannot be read or written.
    """
    src = Path(source)
    name = load_profile_file(src).profile.name
    text = src.read_text()
    data: Any = json.loads(text) if src.suffix.lower() == ".json" else tomllib.loads(text)
    tables = data["profiles"] if isinstance(data.get("profiles"), dict) else data
    table = {k: v for k, v in tables[name].items() if k != "path_delay_curve"}
    tables[name] = {
        **table,
        "path_delay_s": path.d0_s,
        "path_delay_per_request_s": path.d1_s,
        **({"path_delay_curve": [list(p) for p in path.curve]} if path.curve else {}),
        **host_fields(path),
    }
    data["calibration"] = {**data.get("calibration", {}), "path": path.table()}
    out = Path(dest)
    header = "".join(line + "\n" for line in text.splitlines() if line.startswith("#"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(header + tomli_w.dumps(data))
    return out


def build_profile(
    values: dict[str, float], servers: tuple[ServerInfo, ...], name: str | None = None
) -> StepTimeProfile:
    """A :class:`StepTimeProfile` of fitted ``values`` and the servers' limits (the smallest
    KV capacity and limits when they differ)."""
    return StepTimeProfile(
        name=name or profile_name(servers[0].model),
        b0_s=values["b0_s"],
        b_tok_s=values["b_tok_s"],
        b_kv_s=values["b_kv_s"],
        b_pa_s=values["b_pa_s"],
        w_dense_bytes=0.0,
        w_exp_bytes=0.0,
        k_over_e=1.0,
        bw_eff_bytes_per_s=_BW_PLACEHOLDER,
        kv_capacity_tokens=min(s.kv_capacity_tokens for s in servers),
        max_num_batched_tokens=min(s.max_num_batched_tokens for s in servers),
        max_num_seqs=min(s.max_num_seqs for s in servers),
        max_model_len=min(s.max_model_len for s in servers),
        b_seq_s=values["b_seq_s"],
        b_req_s=values["b_req_s"],
    )
