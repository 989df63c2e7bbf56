"""The fidelity table: in the terminal (rich) and as a section of ``report.html``.

Reads only the ``fidelity.json`` document (:func:`sessionroute.experiments.fidelity.
fidelity_document`), so a section can be rebuilt from a kept file.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sessionroute.experiments.fidelity import METRICS

__all__ = ["add_report_section", "fidelity_html", "fidelity_rows", "print_fidelity"]


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def _row(name: str, label: str, c: Mapping[str, Any], error: str) -> list[str]:
    """``arm, metric, live (mean ±half-range), sim, error, bound, ok`` of one metric."""
    if error == "count":
        live = "+".join(_fmt(v) for v in c["live"]) or "-"
        sim = "+".join(_fmt(v) for v in c["sim_runs"]) or "-"
        ok = "" if c["ok"] is None else ("yes" if c["ok"] else "NO")
        return [name, label, live, sim, "", "both or neither", ok]
    scale = 100.0 if error == "pp" else 1.0
    mean = None if c["live_mean"] is None else c["live_mean"] * scale
    sim_value = None if c["sim"] is None else c["sim"] * scale
    spread = sim_spread = ""
    if c["live_min"] is not None and len(c["live"]) > 1:
        spread = f" ±{(c['live_max'] - c['live_min']) * scale / 2:.2g}"
    if c["sim_min"] is not None and c["sim_max"] > c["sim_min"]:
        sim_spread = f" ±{(c['sim_max'] - c['sim_min']) * scale / 2:.2g}"
    unit = " pp" if error == "pp" else " %"
    err = "-" if c["error"] is None else f"{c['error']:+.1f}{unit}"
    bound = ""
    if c["bound"] is not None:
        bound = f"{c['bound']:g}{unit}" + (f" +{c['noise']:.1f}" if c["noise"] else "")
    ok = "" if c["ok"] is None else ("yes" if c["ok"] else "NO")
    return [name, label, f"{_fmt(mean)}{spread}", f"{_fmt(sim_value)}{sim_spread}", err, bound, ok]


def fidelity_rows(doc: Mapping[str, Any]) -> list[list[str]]:
    """One row per arm and metric: arm, metric, live mean ±half-range over repeats,
    simulated, error (points for hit rate, % of live otherwise), bound, within it."""
    rows = []
    for name, cmp in doc["arms"].items():
        for i, m in enumerate(METRICS):
            label = m.label + (" (%)" if m.error == "pp" else "")
            rows.append(_row(name if i == 0 else "", label, cmp[m.key], m.error))
    return rows


def _headers() -> list[str]:
    return ["arm", "metric", "live", "sim", "error", "bound", "ok"]


def _tau_lines(doc: Mapping[str, Any]) -> list[str]:
    lines = []
    for group in doc["ranks"]:
        if len(group["arms"]) < 2:
            continue
        parts = []
        for key, r in group["metrics"].items():
            decided = sum(1 for p in r["pairs"] if p["decided"])
            tau = "-" if r["tau"] is None else f"{r['tau']:+.2f}"
            parts.append(
                f"{key} tau {tau} ({decided} of {len(r['pairs'])} pairs beyond the live spread, "
                f"{r['disagreements']} ordered otherwise)"
            )
        lines.append(f"{', '.join(group['arms'])}: " + "; ".join(parts))
    return lines


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{1000 * v:.0f}"


def _split_lines(doc: Mapping[str, Any]) -> list[str]:
    """Per arm, where the mean TTFT went (:func:`~sessionroute.experiments.fidelity.
    ttft_split`), in ms; none for a document without it."""
    lines = []
    for name, t in (doc.get("ttft_split") or {}).items():
        stalled, wall = t.get("client_stalled_s"), t.get("client_wall_s")
        waited = t.get("client_cpu_wait_s")
        starved = (
            f"; the client's loop stalled {stalled:.1f} s of {wall:.0f} s"
            if stalled is not None and wall
            else ""
        )
        if starved and waited is not None:
            starved += f" (waiting for a core {waited:.1f} s)"
        lines.append(
            f"{name}: live {_ms(t['client'])} = vLLM {_ms(t['server'])} (queue "
            f"{_ms(t['queue'])}, prefill {_ms(t['prefill'])}) + outside vLLM "
            f"{_ms(t['outside'])}{starved}; sim {_ms(t['sim'])} (queue {_ms(t['sim_queue'])})"
        )
    return lines


def _replay_lines(doc: Mapping[str, Any]) -> list[str]:
    """Per arm, the live requests replayed open loop into the simulator's engine (``replay``
    of the document, :mod:`sessionroute.experiments.replay`); none without it."""
    lines = []
    for name, r in (doc.get("replay") or {}).items():
        if r["live_hit_rate"] is None or r["replay_hit_rate"] is None:
            continue
        n = sum(x["requests"] for x in r["runs"])
        same = sum(x["same_cached"] for x in r["runs"])
        pre = "+".join(str(x["replay_preemptions"]) for x in r["runs"])
        queue = [
            x["replay_queue_mean_s"] for x in r["runs"] if x.get("replay_queue_mean_s") is not None
        ]
        prefill = [
            x["replay_prefill_mean_s"]
            for x in r["runs"]
            if x.get("replay_prefill_mean_s") is not None
        ]
        means = (
            f"; engine queue {_ms(sum(queue) / len(queue))} ms, prefill "
            f"{_ms(sum(prefill) / len(prefill))} ms (means)"
            if queue and prefill
            else ""
        )
        lines.append(
            f"{name}: hit rate live {100 * r['live_hit_rate']:.1f} %, replayed "
            f"{100 * r['replay_hit_rate']:.1f} % ({r['error_pp']:+.1f} pp); the same cached "
            f"tokens in {same} of {n} requests; replayed preemptions {pre}{means}"
        )
    return lines


def _conditions_line(doc: Mapping[str, Any]) -> str:
    c = doc["conditions"]
    prof = c.get("profile_name", "?")
    cal = "calibrated" if c.get("calibrated") else "NOT calibrated"
    return (
        f"live: {c.get('repeats_live')} runs per arm, seed {c.get('seed')}; simulated: "
        f"{c.get('repeats_sim')} placement draws of that workload; "
        f"profile {prof} ({cal}); engine {c.get('engine', {}).get('source', '?')}"
    )


def print_fidelity(doc: Mapping[str, Any], console: Any) -> None:
    """Print the table, the rank agreement and the verdict on ``console`` (a rich Console)."""
    from rich.table import Table

    table = Table(
        title="simulator vs live (mean ±half-range: live over repeats, simulated over "
        "placement draws; s, tok/s; bound + noise)"
    )
    for h in _headers():
        table.add_column(h, overflow="fold")
    for row in fidelity_rows(doc):
        table.add_row(*row)
    console.print(table)
    console.print(_conditions_line(doc), highlight=False, markup=False)
    for line in _tau_lines(doc):
        console.print("rank agreement: " + line, highlight=False, markup=False)
    for line in _split_lines(doc):
        console.print("TTFT mean, ms: " + line, highlight=False, markup=False)
    for line in _replay_lines(doc):
        console.print("replay at the live send times: " + line, highlight=False, markup=False)
    failed = [c for c in doc["checks"] if not c["ok"]]
    if failed:
        for c in failed:
            console.print(f"outside: {c['what']}: {c['detail']}", highlight=False, markup=False)
    bounds = ", ".join(f"{k} {v:g}" for k, v in doc["bounds"].items())
    console.print(
        f"fidelity: {'within' if not failed else 'NOT within'} the bounds ({bounds}; "
        f"{len(doc['checks']) - len(failed)} of {len(doc['checks'])} checks)",
        highlight=False,
        markup=False,
    )


def fidelity_html(doc: Mapping[str, Any]) -> str:
    """The report section (an ``<h2>`` and a table; self-contained HTML)."""
    e = html.escape
    head = "".join(f"<th>{e(h)}</th>" for h in _headers())
    body = "".join(
        "<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in fidelity_rows(doc)
    )
    failed = [c for c in doc["checks"] if not c["ok"]]
    items = "".join(f"<li>{e(line)}</li>" for line in _tau_lines(doc))
    items += "".join(f"<li>TTFT mean, ms: {e(line)}</li>" for line in _split_lines(doc))
    items += "".join(
        f"<li>replay at the live send times: {e(line)}</li>" for line in _replay_lines(doc)
    )
    items += "".join(f"<li>outside: {e(c['what'])}: {e(c['detail'])}</li>" for c in failed)
    verdict = "within the bounds" if not failed else f"{len(failed)} checks outside the bounds"
    return (
        '<section id="fidelity"><h2>Simulator vs live</h2>'
        f"<p>{e(_conditions_line(doc))}</p>"
        f'<table class="fidelity"><tr>{head}</tr>{body}</table>'
        f"<ul>{items}</ul><p>Fidelity: {e(verdict)} "
        f"({e(', '.join(f'{k} {v:g}' for k, v in doc['bounds'].items()))}).</p></section>"
    )


def add_report_section(report: Path, doc: Mapping[str, Any]) -> None:
    """Insert :func:`fidelity_html` into ``report`` before ``</body>`` (appended if absent)."""
    text = report.read_text(encoding="utf-8")
    section = fidelity_html(doc)
    at = text.rfind("</body>")
    text = text + section if at < 0 else text[:at] + section + text[at:]
    report.write_text(text, encoding="utf-8")
