#!/usr/bin/env python3
"""Outputs of different lengths under each GPU step rule (core/loop/step_policy.hpp).

1,024 prompts (the extraction prompts of bench_structured.py as plain text), 256 slots,
greedy: every prompt generating the same number of tokens (a lockstep load), then each
generating a length of its own (slots refilled as outputs end, so most steps mix prompt
chunks with generated tokens) with the context's step policy and with one rule changed at
a time; then both loads again on a second context with one KV buffer for all slots
(kv_unified=True, where llama.cpp runs a step as one pass instead of one per run of slots
with equal chunks). The lengths are those the prompts' JSON-schema outputs have (one
constrained call first), the lockstep length their mean, so both loads generate about the
same tokens. The loads take turns, --reps rounds; the wall times, generated tokens/s (wall
clock), llama_decode calls and padding tokens are printed, and written as JSON with --out.

    python bench/bench_step_rules.py --model SPEED_MODEL.gguf [--out FILE]   # every layer on the GPU
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import sys
import time

import fastpar
from fastpar import _core, _testing

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from bench_structured import SCHEMA, prompts, ticket_text  # noqa: E402 - the same task


def params(n_tokens: int, ignore_eos: bool = True):
    p = _core.GenerateParams()
    p.max_tokens, p.temperature, p.seed, p.ignore_eos = n_tokens, 0.0, 1, ignore_eos
    return p


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="GGUF, every layer on the GPU (the F16 speed model)")
    ap.add_argument("--prompts", type=int, default=1024)
    ap.add_argument("--slots", type=int, default=256)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--n-gpu-layers", type=int, default=-1, help="0 runs the GPU's rules on the CPU (a check)")
    ap.add_argument("--loads", default=None,
                    help="only the loads whose names contain one of these comma-separated words, "
                         "besides the lockstep load and the own lengths under the context's rules")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    model = fastpar.Model(args.model, n_gpu_layers=args.n_gpu_layers)
    ctx = fastpar.Context(model, n_parallel=args.slots, n_ctx_per_seq=512)
    unified = fastpar.Context(model, n_parallel=args.slots, n_ctx_per_seq=512, kv_unified=True)
    texts = [ticket_text(i) for i in range(args.prompts)]
    constrained = params(96, ignore_eos=False)
    constrained.json_schema = json.dumps(SCHEMA)
    for c in (ctx, unified):  # warm-up
        c._ctx.generate(prompts(args.slots), [params(96)], None)
    lengths = [max(1, c.n_gen_tokens) for c in ctx._ctx.generate(prompts(args.prompts), [constrained], None)]
    mean = round(sum(lengths) / len(lengths))
    each = [params(n) for n in lengths]

    def policy(kv_unified=False, **changes):
        p = _testing.resolve_step_policy(output_on_gpu=True, kv_unified=kv_unified, memory_copies_by_position=True,
                                         share_prefixes=True, n_parallel=args.slots, n_threads=ctx.n_threads)
        for name, value in changes.items():
            setattr(p, name, value)
        return p

    loads = [
        ("lockstep, the mean length", ctx, [params(mean)], policy()),
        ("own lengths", ctx, each, policy()),
        ("own lengths, no padding", ctx, each, policy(max_padded_gap=0)),
        ("own lengths, slots not kept together", ctx, each, policy(compact_slots=False)),
        ("own lengths, refills at once (no waves)", ctx, each, policy(refill_wave=0)),
        ("own lengths, every gap padded", ctx, each, policy(max_padded_gap=1 << 30)),
        ("own lengths, no last-token rule", ctx, each, policy(last_prompt_token_alone=False)),
        ("own lengths, no prompts-first steps", ctx, each, policy(prompts_first=False)),
        ("kv_unified: lockstep, the mean length", unified, [params(mean)], policy(kv_unified=True)),
        ("kv_unified: own lengths", unified, each, policy(kv_unified=True)),
    ]
    if args.loads:
        words = args.loads.split(",")
        loads = [load for load in loads
                 if load[0] in ("lockstep, the mean length", "own lengths") or any(w in load[0] for w in words)]
    results = {"what": "outputs of different lengths under each GPU step rule",
               "machine": f"{platform.machine()}, {os.cpu_count()} cores",
               "model": os.path.basename(args.model), "prompts": args.prompts, "slots": args.slots,
               "mean_length": mean, "gen_tokens": sum(lengths), "loads": []}
    walls: dict = {name: [] for name, *_ in loads}
    last: dict = {}
    for rep in range(args.reps):
        for name, c, p, pol in loads:
            t0 = time.perf_counter()
            _testing.generate_with_policy(c._ctx, texts, p, pol)
            walls[name].append(round(time.perf_counter() - t0, 2))
            last[name] = c.last_stats
            print(json.dumps({"rep": rep, "load": name, "wall_s": walls[name][-1]}), flush=True)
    for name, *_ in loads:
        s, wall = last[name], statistics.median(walls[name])
        row = {"load": name, "wall_s": walls[name], "median_wall_s": wall,
               "gen_tok_s": round(s.n_gen_tokens / wall, 1), "decode_calls": s.n_decode_calls,
               "padding_tokens": s.n_padding_tokens, "gen_tokens": s.n_gen_tokens}
        results["loads"].append(row)
        print(json.dumps(row), flush=True)
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
