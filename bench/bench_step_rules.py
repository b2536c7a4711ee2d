#!/usr/bin/env python3
"""Outputs of different lengths under each GPU step rule (core/loop/step_policy.hpp).

1,024 prompts (the extraction prompts of bench_structured.py as plain text), 256 slots,
greedy: every prompt generating the same number of tokens (a lockstep load), then each
generating a length of its own (slots refilled as outputs end, so most steps mix prompt
chunks with generated tokens) with the context's step policy and with one rule changed at
a time. The lengths are those the prompts' JSON-schema outputs have (one constrained call
first), the lockstep length their mean, so both loads generate about the same tokens.
Each is run --reps times on one context; the wall times, llama_decode calls and padding
tokens of the call are printed, and written as JSON with --out.

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
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    model = fastpar.Model(args.model, n_gpu_layers=args.n_gpu_layers)
    ctx = fastpar.Context(model, n_parallel=args.slots, n_ctx_per_seq=512)
    texts = [ticket_text(i) for i in range(args.prompts)]
    constrained = params(96, ignore_eos=False)
    constrained.json_schema = json.dumps(SCHEMA)
    ctx._ctx.generate(prompts(args.slots), [params(96)], None)  # warm-up
    lengths = [max(1, c.n_gen_tokens) for c in ctx._ctx.generate(prompts(args.prompts), [constrained], None)]
    mean = round(sum(lengths) / len(lengths))
    each = [params(n) for n in lengths]

    def policy(**changes):
        p = _testing.resolve_step_policy(output_on_gpu=True, kv_unified=False, memory_copies_by_position=True,
                                         share_prefixes=True, n_parallel=args.slots, n_threads=ctx.n_threads)
        for name, value in changes.items():
            setattr(p, name, value)
        return p

    loads = [
        ("lockstep, the mean length", [params(mean)], policy()),
        ("own lengths", each, policy()),
        ("own lengths, no padding", each, policy(max_padded_gap=0)),
        ("own lengths, every gap padded", each, policy(max_padded_gap=1 << 30)),
        ("own lengths, no last-token rule", each, policy(last_prompt_token_alone=False)),
        ("own lengths, no prompts-first steps", each, policy(prompts_first=False)),
    ]
    results = {"what": "outputs of different lengths under each GPU step rule",
               "machine": f"{platform.machine()}, {os.cpu_count()} cores",
               "model": os.path.basename(args.model), "prompts": args.prompts, "slots": args.slots,
               "mean_length": mean, "gen_tokens": sum(lengths), "loads": []}
    for name, p, pol in loads:
        walls = []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            _testing.generate_with_policy(ctx._ctx, texts, p, pol)
            walls.append(round(time.perf_counter() - t0, 2))
        s = ctx.last_stats
        row = {"load": name, "wall_s": walls, "median_wall_s": statistics.median(walls),
               "decode_calls": s.n_decode_calls, "padding_tokens": s.n_padding_tokens, "gen_tokens": s.n_gen_tokens}
        results["loads"].append(row)
        print(json.dumps(row), flush=True)
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
