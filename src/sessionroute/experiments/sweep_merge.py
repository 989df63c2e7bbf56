"""``sessionroute sweep --merge DIR``: add arms to a finished sweep without running it again.

A sweep of 11 arms x 4 values x 3 seeds may take hours; after a change to one policy only
that policy needs running again. ``--merge DIR`` takes the runs of every arm *not* being run
now from ``DIR/sweep.json`` (its ``runs``: one row per run with every metric a verdict reads),
and the new sweep's points, verdicts and knee are computed over all arms, as if they had run
together. It is refused unless both sweeps vary the same knob over the same values, run the
same seeds, and every arm runs on the same settings (workload, replicas, router, simulator,
faults: the ``settings`` each arm is simulated with, recorded per value in ``sweep.json``;
for a ``sweep.json`` written before it recorded them, read from the experiment that
``DIR/report.html`` embeds) and counts the SLO goodput against the same SLO; an arm kept from
``DIR`` must run with the same options under both objectives' kinds. Arms run now replace the
earlier arms of the same name.
"""

from __future__ import annotations

import html
import json
import re
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sessionroute.errors import ConfigError
from sessionroute.experiments.objective import Objective, objective_kind
from sessionroute.experiments.results import ArmResult, RunOutput
from sessionroute.experiments.spec import ResolvedArm
from sessionroute.experiments.verdict import PARETO_AXES

if TYPE_CHECKING:
    from sessionroute.experiments.sweep import Knob

__all__ = ["EarlierSweep", "check_merge", "load_earlier", "merge_arms", "settings_by_value"]


class EarlierSweep:
    """A finished sweep read back for ``--merge``.

    Attributes:
        path: its ``sweep.json``.
        doc: the document.
        settings: knob value -> the settings its arms ran with.
    """

    def __init__(self, path: Path, doc: dict[str, Any], settings: dict[float, Any]) -> None:
        self.path = path
        self.doc = doc
        self.settings = settings


def _plain(value: Any) -> Any:
    """``value`` as JSON would give it back, without None entries (TOML has none)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value if v is not None]
    return value


def settings_by_value(arms: Sequence[ResolvedArm]) -> dict[float, Any]:
    """Knob value -> the settings of the arms at that value (one arm's: the arms of one
    value differ only in their policy)."""
    out: dict[float, Any] = {}
    for arm in arms:
        value = float(arm.name.rpartition("@")[2])
        out.setdefault(value, _plain(arm.settings))
    return out


def _new_defaults_filled(then: Any, here: Any, defaults: Any) -> Any:
    """``then`` with each setting it lacks that ``here`` holds at today's default: a setting
    added to sessionroute since the earlier sweep ran, which ran without it (a new setting's
    default keeps the earlier behaviour)."""
    if not (isinstance(then, dict) and isinstance(here, dict) and isinstance(defaults, dict)):
        return then
    out = dict(then)
    for key, value in here.items():
        if key in out:
            out[key] = _new_defaults_filled(out[key], value, defaults.get(key))
        elif key in defaults and defaults[key] == value:
            out[key] = value
    return out


def _default_settings() -> dict[str, Any]:
    """Every shared setting at its default now (plain, as :func:`settings_by_value` gives)."""
    from sessionroute.experiments.spec import ExperimentSpec

    spec = ExperimentSpec.model_validate({"arms": [{"policy": "random"}]})
    return dict(_plain(spec.model_dump(exclude={"arms", "objective", "wandb", "name"})))


def _without_run(settings: Any) -> Any:
    """Settings without ``run`` (seed and repeats: the seeds are compared run by run)."""
    return (
        {k: v for k, v in settings.items() if k != "run"}
        if isinstance(settings, dict)
        else settings
    )


def _report_settings(path: Path) -> dict[float, Any] | None:
    """The settings per value from the experiment a sweep's ``report.html`` embeds."""
    if not path.exists():
        return None
    m = re.search(r"<h2>Experiment</h2><pre>(.*?)</pre>", path.read_text("utf-8"), re.S)
    if m is None:
        return None
    doc = tomllib.loads(html.unescape(m.group(1)))
    out: dict[float, Any] = {}
    for arm in doc.get("arms", []):
        out.setdefault(float(str(arm["name"]).rpartition("@")[2]), _plain(arm["settings"]))
    return out


def load_earlier(directory: Path) -> EarlierSweep:
    """Read ``directory/sweep.json`` and the settings its arms ran with.

    Raises:
        ConfigError: naming the file, when it is missing or unreadable, not a sweep, lacks
            a key ``--merge`` reads, or records no settings (nor embeds its experiment in
            ``report.html``).
    """
    path = directory / "sweep.json"
    try:
        doc = json.loads(path.read_text("utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"--merge: {path} does not exist (a sweep's output directory?)") from None
    except OSError as exc:  # DIR is a file (sweep.json itself?), unreadable...
        raise ConfigError(
            f"--merge: cannot read {path}: {exc.strerror or exc} (--merge takes the directory "
            "of a finished sweep)"
        ) from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--merge: {path} is not JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("schema") != "sessionroute.sweep/1":
        raise ConfigError(f"--merge: {path} is not a sessionroute sweep (schema)")
    missing = [k for k in ("knob", "values", "policies", "runs") if k not in doc]
    if missing:
        raise ConfigError(f"--merge: {path} lacks {', '.join(missing)} (a cut or edited file?)")
    recorded = doc.get("settings")
    if recorded is not None:
        if not isinstance(recorded, list) or len(recorded) != len(doc["values"]):
            raise ConfigError(
                f"--merge: {path} records settings for {len(recorded)} value(s) of "
                f"{len(doc['values'])} (a cut or edited file?)"
            )
        settings = {float(v): s for v, s in zip(doc["values"], recorded, strict=True)}
    else:
        found = _report_settings(directory / "report.html")
        if found is None:
            raise ConfigError(
                f"--merge: {path} records no settings and {directory / 'report.html'} embeds "
                "no experiment: cannot check that the sweeps ran the same experiment"
            )
        settings = found
    return EarlierSweep(path, doc, settings)


def _nested(row: dict[str, Any], paths: Sequence[str]) -> dict[str, Any]:
    """A metrics dict with the value of each dotted path of ``row``."""
    out: dict[str, Any] = {}
    for path in paths:
        *parents, leaf = path.split(".")
        cur = out
        for p in parents:
            cur = cur.setdefault(p, {})
        cur[leaf] = row[path]
    return out


def check_merge(
    earlier: EarlierSweep,
    knob: Knob,
    values: Sequence[float],
    seeds: Sequence[int],
    arms: Sequence[ResolvedArm],
    objective: Objective,
) -> dict[tuple[str, float], list[RunOutput]]:
    """Check that ``earlier`` can be merged into the sweep of ``arms`` and read its other
    arms' runs: (label, value) -> runs in seed order, each with the metrics of its row.

    Raises:
        ConfigError: naming the earlier file and what differs, unless both sweeps vary
            ``knob`` over ``values``, ran ``seeds`` and ran every value with the same
            settings (a setting it does not name counts as today's default) and the same SLO
            (``slo_goodput``'s); or when its runs lack a metric the verdict reads.
    """
    doc = earlier.doc
    where = f"--merge: {earlier.path}"
    if doc["knob"]["name"] != knob.name:
        raise ConfigError(f"{where} varied {doc['knob']['name']!r}, this sweep {knob.name!r}")
    if [float(v) for v in doc["values"]] != [float(v) for v in values]:
        raise ConfigError(f"{where} ran values {doc['values']}, this sweep {list(values)}")
    now = settings_by_value(arms)
    defaults = _default_settings()
    for value in values:
        here = _without_run(now.get(float(value)))
        then = _new_defaults_filled(
            _without_run(earlier.settings.get(float(value))), here, defaults
        )
        if then != here:
            raise ConfigError(
                f"{where} ran another experiment at {knob.name} = {value:g} (settings differ "
                f"at {_first_difference(then, here)}): merge only sweeps of one experiment"
            )
    ran_now = {a.name.rpartition("@")[0] for a in arms}
    _check_objective_kind(doc, objective, ran_now, where)
    _check_slo(doc, objective, where)
    paths = [objective.metric, *(c.metric for c in objective.constraints)]
    paths += [p for p, _ in PARETO_AXES if p not in paths]
    by_arm: dict[tuple[str, float], list[RunOutput]] = {}
    for row in doc["runs"]:
        label = str(row["policy"])
        if label in ran_now:
            continue
        missing = [p for p in paths if p not in row]
        if missing:
            raise ConfigError(
                f"{where}: its runs lack {', '.join(missing)}, which the verdict reads"
            )
        key = (label, float(row[knob.name]))
        metrics = [p for p in row if p not in (knob.name, "policy", "seed")]
        by_arm.setdefault(key, []).append(RunOutput(int(row["seed"]), _nested(row, metrics)))
    for (label, value), runs in by_arm.items():
        runs.sort(key=lambda r: r.seed)
        got = [r.seed for r in runs]
        if got != sorted(seeds):
            raise ConfigError(
                f"{where}: {label} at {value:g} ran seeds {got}, this sweep runs {sorted(seeds)}"
            )
    return by_arm


def _check_objective_kind(
    doc: dict[str, Any], objective: Objective, ran_now: set[str], where: str
) -> None:
    """Refuse to keep an earlier arm whose policy runs with other options under this sweep's
    kind of objective than under the earlier sweep's (``Policy.objective_options``): its runs
    are not what the arm would run now. Arms named other than by their policy are not checked.

    Raises:
        ConfigError: naming the arm and both objectives.
    """
    from sessionroute.router.policies.options import parse_policy
    from sessionroute.router.policies.registry import policy_class

    then = str(doc.get("objective", {}).get("metric", ""))
    kind_then = objective_kind(then)
    kind_now = objective.kind
    if kind_then == kind_now:
        return
    for label in sorted({str(r["policy"]) for r in doc["runs"]} - ran_now):
        try:
            options = policy_class(parse_policy(label)[0]).objective_options
        except ConfigError:
            continue
        if options.get(kind_then or "", {}) != options.get(kind_now or "", {}):
            raise ConfigError(
                f"{where} ran {label} under the objective {then or '(none recorded)'}; under "
                f"this sweep's, {objective.metric}, it runs with other options "
                '(docs/objectives.md, "A policy\'s options for the objective"): rerun it too'
            )


def _check_slo(doc: dict[str, Any], objective: Objective, where: str) -> None:
    """Refuse an earlier sweep whose runs counted the SLO goodput against another SLO than
    this sweep's (its rows' ``slo_goodput`` would not be this sweep's). One that records no
    SLO (written before objectives) is not checked: its runs lack the metric if a verdict needs
    it. The objective's metric and constraints may differ: the verdicts are taken anew over
    every arm on this sweep's, from rows that must hold its metrics (checked after this).

    Raises:
        ConfigError: naming both SLOs.
    """
    slo = doc.get("objective", {}).get("slo")
    then = (slo.get("ttft_s"), slo.get("itl_s")) if isinstance(slo, dict) else (None, None)
    if not all(isinstance(x, int | float) for x in then):
        return
    here = (objective.slo_ttft_s, objective.slo_itl_s)
    if then != here:

        def words(ttft: Any, itl: Any) -> str:
            return f"TTFT <= {ttft:g} s and ITL <= {itl:g} s"

        raise ConfigError(
            f"{where} counted SLO goodput against {words(*then)}, this sweep against "
            f"{words(*here)}: its runs' "
            "slo_goodput is not this sweep's; declare the same SLO ([objective] slo_ttft_s, "
            "slo_itl_s) or rerun every arm"
        )


def merge_arms(
    earlier: EarlierSweep,
    knob: Knob,
    values: Sequence[float],
    by_arm: dict[tuple[str, float], list[RunOutput]],
    arms: Sequence[ResolvedArm],
    results: Sequence[ArmResult],
) -> tuple[list[ResolvedArm], list[ArmResult]]:
    """The arms and results of a sweep over every arm: those run now (``arms``,
    ``results``) and the earlier sweep's other arms (``by_arm``, what :func:`check_merge`
    read from its runs before they ran). Ordered by value, then in the earlier sweep's arm
    order (an arm run now in its earlier place; arms new to it last)."""
    settings = settings_by_value(arms)
    mine = {a.name.rpartition("@")[0]: None for a in arms}
    order = [str(p) for p in earlier.doc["policies"]]
    order += [label for label in mine if label not in order]
    now = {a.name: (a, r) for a, r in zip(arms, results, strict=True)}
    out_arms: list[ResolvedArm] = []
    out_results: list[ArmResult] = []
    for value in values:
        for label in order:
            name = f"{label}@{knob.cast(value)}"
            if label in mine:
                arm, result = now[name]
                out_arms.append(arm)
                out_results.append(result)
                continue
            runs = by_arm.get((label, float(value)))
            if runs is not None:
                out_arms.append(
                    ResolvedArm(
                        name=name, policy=label, policy_options={}, settings=settings[float(value)]
                    )
                )
                out_results.append(ArmResult(name, label, {}, runs))
    return out_arms, out_results


def _first_difference(a: Any, b: Any, at: str = "") -> str:
    """The first dotted path at which ``a`` and ``b`` differ, with both values."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                return _first_difference(a.get(k), b.get(k), f"{at}.{k}" if at else k)
    return f"{at or 'the top'}: {a!r} there, {b!r} here"
