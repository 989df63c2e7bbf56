"""``sessionroute calibrate --url URL ...``: fit a step-time profile to running vLLM servers."""

from __future__ import annotations

import argparse
import sys
from typing import Any

__all__ = ["register"]

_UNITS = {
    "b0_s": (1e3, "ms / step"),
    "b_tok_s": (1e6, "µs / token"),
    "b_seq_s": (1e6, "µs / decoding seq"),
    "b_req_s": (1e3, "ms / new request"),
    "b_kv_s": (1e9, "ns / context token"),
    "b_pa_s": (1e12, "ps / token²"),
}


def register(sub: Any) -> None:
    """Add the ``calibrate`` subcommand to ``sub`` (an argparse subparsers object)."""
    parser = sub.add_parser(
        "calibrate",
        help="fit the replica step-time model to running vLLM servers; write a profile file",
        description=(
            "Read what running OpenAI-compatible vLLM servers say of themselves (/metrics: "
            "block size and KV blocks; /v1/models: max_model_len; /server_info: batch limits), "
            "send a designed probe (prefills of several lengths, cached vs fresh prefill, "
            "decode at several batch sizes and context lengths, a closed loop of arriving and "
            "finishing requests), scrape vLLM's own histograms before and after each phase, "
            "fit t_step = b0 + b_tok*N + b_seq*D + b_req*R + b_kv*C + b_pa*A (non-negative "
            "least squares on relative errors), print each constant's error and write a "
            'profile file that [replicas] profile = "FILE" loads (docs/simulator.md, '
            '"Calibrating against a real server"). Probe requests use token-id prompts, '
            "temperature 0, ignore_eos and max_tokens; the servers' prefix caches are reset "
            "between phases when they allow it (VLLM_SERVER_DEV_MODE=1)."
        ),
    )
    parser.add_argument(
        "--url",
        action="append",
        required=True,
        metavar="URL",
        help="a server's base URL, e.g. http://127.0.0.1:8000 (repeat for several servers "
        "of the same model and block size)",
    )
    parser.add_argument(
        "--out",
        default="profile.toml",
        metavar="FILE",
        help="profile file to write (default: profile.toml)",
    )
    parser.add_argument(
        "--max-num-seqs",
        type=int,
        metavar="N",
        help="the servers' --max-num-seqs, when /server_info does not give it",
    )
    parser.add_argument(
        "--max-num-batched-tokens",
        type=int,
        metavar="N",
        help="the servers' --max-num-batched-tokens, when /server_info does not give it",
    )
    parser.add_argument(
        "--probe",
        choices=("all", "together", "first"),
        default="all",
        help="all (default): probe every server in turn, the others idle; together: probe "
        "every server at once, the same round sent to each at the same moment, so that each "
        "is measured while the others and the client carry the same load, as when a router "
        "spreads a workload over them (servers sharing a host's cores or memory bandwidth; "
        "what `compare --fidelity` uses for servers on one host); first: probe only the "
        "first (the others are read). Every mode fits one profile over all it measured",
    )
    parser.add_argument(
        "--reps",
        type=int,
        default=7,
        metavar="N",
        help="rounds of each phase; the fit takes each phase's median round (7; churn: N // 2)",
    )
    parser.add_argument(
        "--decode-tokens",
        type=int,
        default=48,
        metavar="N",
        help="output tokens of a decode-phase request (48)",
    )
    parser.add_argument(
        "--no-stream",
        action="store_true",
        help="send plain (non-streaming) probe requests and fit vLLM's own histograms: for "
        "workloads that do not stream (a [live] section without stream = true). By default "
        "probes stream and the fit uses times measured at the client, which include the "
        "frontend's per-token work",
    )
    parser.add_argument("--name", help="profile name (default: calibrated-<served model>)")
    parser.add_argument(
        "--timeout", type=float, default=120.0, metavar="S", help="per request, seconds (120)"
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="after fitting, run a held-out probe-like workload (48 requests, Poisson arrivals "
        "at 6/s and at 16/s, shared prefixes, varied lengths) on the first server live and "
        "through the fitted model, and print TTFT, ITL and tok/s side by side",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="read the servers' self-description (GET only), print the probe plan and stop: "
        "no probe request, no cache reset",
    )
    parser.set_defaults(handler=_run)


def _fmt_term(name: str, value: float) -> str:
    mult, unit = _UNITS[name]
    return f"{value * mult:.4g} {unit}"


def _print_servers(console: Any, servers: Any) -> None:
    from rich.table import Table

    table = Table(title="servers")
    table.add_column("url", overflow="fold", min_width=22)
    for col in ("model", "vLLM", "block", "KV tokens", "max seqs", "batch tokens", "limits"):
        table.add_column(col)
    for s in servers:
        table.add_row(
            s.url,
            s.model,
            s.vllm_version or "?",
            str(s.block_size),
            str(s.kv_capacity_tokens),
            str(s.max_num_seqs),
            str(s.max_num_batched_tokens),
            s.limits_from,
        )
    console.print(table)


def _print_plan(console: Any, plan: Any, n_servers: int, mode: str) -> None:
    from rich.table import Table

    table = Table(title=f"probe plan (per server; {plan.num_requests} requests)")
    table.add_column("phase")
    table.add_column("sends")
    for p in plan.phases:
        table.add_row(p.label, p.describe())
    console.print(table)
    if n_servers > 1:
        how = "at once, in lockstep" if mode == "together" else "one after the other"
        console.print(f"{n_servers} servers probed {how}")


def print_fit(console: Any, result: Any) -> None:
    """Print the fitted constants with their errors, and each phase's error (rich tables)."""
    from rich.table import Table

    terms = Table(title="fitted step-time constants")
    for col in ("term", "value", "fit error (±1 s.e.)", "share of time"):
        terms.add_column(col)
    for t in result.fit.terms:
        terms.add_row(t.name, _fmt_term(t.name, t.value), t.error_text(), f"{t.share:.1%}")
    console.print(terms)
    phases = Table(title="phases: measured vs fitted model")
    for col in ("phase", "measured", "measured (ms)", "model (ms)", "error", "vLLM's (ms)"):
        phases.add_column(col)
    several = len({p.server for p in result.fit.phases}) > 1
    for p in result.fit.phases:
        phases.add_row(
            f"{p.label} @ {p.server}" if several else p.label,
            p.source,
            f"{p.measured_s * 1e3:.2f}",
            f"{p.predicted_s * 1e3:.2f}",
            f"{p.error:+.1%}",
            "-" if p.server_s is None else f"{p.server_s * 1e3:.2f}",
        )
    console.print(phases)
    kinds = dict.fromkeys(p.kind for p in result.fit.phases)
    rms = ", ".join(f"{k} {result.fit.rms_error(k):.1%}" for k in kinds)
    console.print(f"RMS error by phase kind: {rms}; all {result.fit.rms_error():.1%}")
    console.print(
        "measured at the client (streaming, as `compare --live` measures); vLLM's: the "
        "server's own histogram of the same interval (the gap is HTTP and its frontend)"
    )


def print_check(console: Any, checks: Any, rates: Any) -> None:
    """Print :class:`~sessionroute.calibrate.CheckResult` s (live vs model, error), one per
    arrival rate."""
    from rich.table import Table

    table = Table(
        title=f"check: held-out workload ({checks[0].requests} streaming requests), live vs model"
    )
    for col in ("arrivals", "metric", "live", "model", "error", "vLLM's (mean)"):
        table.add_column(col)
    for check, rate in zip(checks, rates, strict=True):
        errors = check.errors()
        for key, live in check.live.items():
            scale, fmt = (1.0, "{:.0f}") if key == "tok_per_s" else (1e3, "{:.2f} ms")
            server = check.server.get(key)
            table.add_row(
                f"{rate:g}/s",
                key,
                fmt.format(live * scale),
                fmt.format(check.sim[key] * scale),
                f"{errors[key]:+.1%}" if key in errors else "-",
                "-" if server is None else fmt.format(server * scale),
            )
    console.print(table)


def _run(args: argparse.Namespace) -> int:
    import asyncio

    import aiohttp
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from sessionroute.calibrate import (
        CalibrationError,
        calibrate,
        inspect_servers,
        plan_for,
        write_profile,
    )

    console = Console(width=max(Console().width, 110))
    err = Console(stderr=True)

    def fail(message: str) -> int:
        err.print(f"sessionroute calibrate: error: {escape(message)}")
        return 1

    if args.reps < 1 or args.decode_tokens < 2:
        return fail("--reps must be >= 1 and --decode-tokens >= 2")

    async def inspect() -> Any:
        timeout = aiohttp.ClientTimeout(total=args.timeout)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            return await inspect_servers(
                session,
                args.url,
                max_num_seqs=args.max_num_seqs,
                max_num_batched_tokens=args.max_num_batched_tokens,
            )

    try:
        servers = asyncio.run(inspect())
        plan = plan_for(
            servers, reps=args.reps, decode_tokens=args.decode_tokens, stream=not args.no_stream
        )
    except (CalibrationError, ValueError) as exc:
        return fail(str(exc))
    _print_servers(console, servers)
    probed = len(servers) if args.probe != "first" else 1
    _print_plan(console, plan, probed, args.probe)
    if args.dry_run:
        console.print("dry run: nothing sent")
        return 0
    with Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} rounds"),
        TimeElapsedColumn(),
        console=console,
    ) as bar:
        task = bar.add_task("probing", total=sum(p.rounds for p in plan.phases) * probed)

        def on_phase(done: int, total: int, label: str) -> None:
            bar.update(task, advance=1, description=label)

        try:
            result = calibrate(
                args.url,
                plan=plan,
                max_num_seqs=args.max_num_seqs,
                max_num_batched_tokens=args.max_num_batched_tokens,
                probe=args.probe,
                name=args.name,
                timeout_s=args.timeout,
                progress=on_phase,
            )
        except (CalibrationError, ValueError) as exc:
            return fail(str(exc))
    print_fit(console, result)
    if args.check and not args.no_stream:
        from sessionroute.calibrate import CheckWorkload, check_profile

        # as probed: with --probe together every server runs the check at once (the first's
        # figures are printed), else the first alone
        checked = result.servers[:probed] if args.probe == "together" else result.servers[:1]

        async def check_all(rate: float) -> Any:
            w = CheckWorkload(rate_per_s=rate)
            return await asyncio.gather(
                *(check_profile(s, result.profile, result.block_size, w) for s in checked)
            )

        checks = []
        for rate in (6.0, 16.0):  # light load, and arrivals that keep a queue
            try:
                checks.append(asyncio.run(check_all(rate))[0])
            except CalibrationError as exc:
                return fail(str(exc))
        if len(checked) > 1:
            console.print(f"check: {len(checked)} servers at once, the first's figures")
        print_check(console, checks, (6.0, 16.0))
    try:
        path = write_profile(result, args.out)
    except OSError as exc:
        return fail(f"cannot write {args.out}: {exc}")
    console.print(
        f"wrote {escape(str(path))} (profile {result.profile.name!r}) in {result.wall_s:.0f} s; "
        + escape(f'use it with [replicas] profile = "{path}"')
    )
    sys.stdout.flush()
    return 0
