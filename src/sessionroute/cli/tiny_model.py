"""``sessionroute tiny-model DIR``: make the tiny random-weight model for real vLLM on a CPU."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["register"]


def register(sub: Any) -> None:
    """Add the ``tiny-model`` subcommand to ``sub`` (an argparse subparsers object)."""
    parser = sub.add_parser(
        "tiny-model",
        help="make a tiny random-weight Llama + BPE tokenizer that vLLM can serve (no hub)",
        description=(
            "Write a tiny LlamaForCausalLM with random weights and a locally trained byte-level "
            "BPE tokenizer with a chat template into DIR (docs/live.md). Needs torch, "
            "transformers and tokenizers: run it with the vLLM venv's interpreter, or pass "
            "--python PATH to run it there."
        ),
    )
    parser.add_argument("dir", metavar="DIR", help="output directory")
    parser.add_argument("--seed", type=int, default=0, help="seed of corpus and weights")
    parser.add_argument(
        "--python",
        metavar="PATH",
        help="interpreter that has torch/transformers/tokenizers (the vLLM venv's python)",
    )
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from sessionroute.experiments.live.tiny_model import build_tiny_model, can_build_here

    if args.python is None:
        if not can_build_here():
            print(
                "sessionroute tiny-model: error: this interpreter lacks torch, transformers or "
                "tokenizers; pass --python PATH of one that has them (the vLLM venv)",
                file=sys.stderr,
            )
            return 2
        print(build_tiny_model(args.dir, seed=args.seed))
        return 0
    src = str(Path(__file__).resolve().parents[2])  # the directory holding 'sessionroute'
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH", "")) if p)
    cmd = [
        args.python,
        "-m",
        "sessionroute.experiments.live.tiny_model",
        args.dir,
        "--seed",
        str(args.seed),
    ]
    try:
        return subprocess.call(cmd, env=env)
    except OSError as exc:
        print(f"sessionroute tiny-model: error: cannot run {args.python!r}: {exc}", file=sys.stderr)
        return 2
