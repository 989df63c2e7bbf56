"""``sessionroute policies``: the routing policies, their options and the knobs a tuner turns."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

__all__ = ["register"]


def register(sub: Any) -> None:
    """Add the ``policies`` subcommand to ``sub`` (an argparse subparsers object)."""
    parser = sub.add_parser(
        "policies",
        help="list the routing policies, or one policy's options and tunable knobs",
        description=(
            "Without NAME: every built-in policy with a line of its docstring. With NAME (a "
            "built-in name or package.module:Class): each option of the policy's Config with "
            "its default, and for the tunable ones the range `sessionroute tune` searches. "
            "Options are written name(key=value, ...) on compare/sweep --policies and serve "
            "--policy, or in a policy file (serve --policy-config FILE, compare --policies "
            "@FILE)."
        ),
        allow_abbrev=False,
    )
    parser.add_argument("name", nargs="?", help="a policy to describe")
    parser.set_defaults(handler=_run)


def _summary(cls: type[Any]) -> str:
    """The first paragraph of the policy module's docstring, without its leading name and
    without reStructuredText's double backquotes (a terminal shows them as they are)."""
    import sys

    doc = (sys.modules[cls.__module__].__doc__ or cls.__doc__ or "").strip()
    first = doc.split("\n\n")[0].replace("\n", " ")
    head, sep, rest = first.partition(": ")
    text = rest if sep and head.strip("`") == getattr(cls, "name", None) else first
    return text.replace("``", "")


def _run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Column, Table

    from sessionroute.errors import SessionRouteError
    from sessionroute.router.policies.options import knobs
    from sessionroute.router.policies.registry import policy_class, policy_names

    out = Console()
    if args.name is None:
        names = policy_names()
        policy = Column("policy", no_wrap=True, min_width=max(map(len, names)))  # copyable
        knob_names = Column("tunable knobs", overflow="fold")
        table = Table(policy, "what it does", knob_names, title="routing policies")
        for name in names:
            cls = policy_class(name)
            table.add_row(name, escape(_summary(cls)), ", ".join(knobs(cls)) or "-")
        out.print(table)
        return 0
    try:
        cls = policy_class(args.name)
    except SessionRouteError as exc:
        Console(stderr=True).print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        return 2
    out.print(f"[bold]{escape(args.name)}[/bold]: {escape(_summary(cls))}")
    cfg = cls.Config
    if cfg is None or not dataclasses.is_dataclass(cfg):
        out.print("no options")
        return 0
    tunable = knobs(cls)
    by_kind = cls.objective_options  # kind of objective -> the options it runs with
    table = Table("option", "default", *(f"under {k}" for k in by_kind), "tuning range")
    for field in dataclasses.fields(cfg):
        default = field.default if field.default is not dataclasses.MISSING else "(required)"
        spec = tunable.get(field.name)
        shown = spec.describe().split(" (default")[0] if spec else "-"
        under = [escape(repr(o[field.name])) if field.name in o else "" for o in by_kind.values()]
        table.add_row(field.name, escape(repr(default)), *under, shown)
    out.print(table)
    if by_kind:
        out.print(
            "under KIND: the option's value when the objective is of that kind (compare and "
            "sweep on a workload of that kind, serve --objective KIND), unless written "
            "(docs/objectives.md)",
            highlight=False,
        )
    return 0
