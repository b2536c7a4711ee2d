#!/usr/bin/env python3
"""Refills in waves (StepPolicy::refill_wave) on outputs of different lengths.

1,024 prompts of about 35 tokens (30 random words, the same on every machine), 256 slots,
greedy with ignore_eos: every prompt generating the mean length (a lockstep load), then
each generating a length of its own (34-96 tokens), slots refilled as outputs end: under
the context's rules (waves of an eighth of the slots), refilled at once (no waves), and in
waves of 16 and 64. The loads take turns, --reps rounds; printed per load: the median wall
time, generated tokens/s (wall clock) and its ratio to the lockstep load's, llama_decode
calls and ms a call, and how many outputs equal those of the context's own rules (on a GPU
a batch of another shape may round a near-tie the other way; on a CPU all do).

    python bench/bench_refill_waves.py --model SPEED_MODEL.gguf [--reps 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import random
import statistics
import sys
import time

import fastpar
from fastpar import _testing

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from bench_step_rules import params  # noqa: E402 - greedy, ignore_eos, as there

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau".split()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="GGUF, every layer on the GPU (the F16 speed model)")
    ap.add_argument("--prompts", type=int, default=1024)
    ap.add_argument("--slots", type=int, default=256)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--n-gpu-layers", type=int, default=-1, help="0 runs the GPU's rules on the CPU (a check)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    rnd = random.Random(7)
    texts = [" ".join(rnd.choice(WORDS) for _ in range(30)) + f" {i}" for i in range(args.prompts)]
    lengths = [rnd.randint(34, 96) for _ in range(args.prompts)]
    mean = round(sum(lengths) / len(lengths))
    model = fastpar.Model(args.model, n_gpu_layers=args.n_gpu_layers)
    ctx = fastpar.Context(model, n_parallel=args.slots, n_ctx_per_seq=160)

    def policy(**changes):
        p = _testing.resolve_step_policy(output_on_gpu=True, kv_unified=False, memory_copies_by_position=True,
                                         share_prefixes=True, n_parallel=args.slots, n_threads=ctx.n_threads)
        for name, value in changes.items():
            setattr(p, name, value)
        return p

    own = [params(n) for n in lengths]
    loads = [("lockstep, the mean length", [params(mean)], policy()),
             (f"own lengths, waves of {policy().refill_wave} (the context's rules)", own, policy()),
             ("own lengths, refills at once (no waves)", own, policy(refill_wave=0)),
             ("own lengths, waves of 16", own, policy(refill_wave=16)),
             ("own lengths, waves of 64", own, policy(refill_wave=64))]
    _testing.generate_with_policy(ctx._ctx, texts[:args.slots], [params(32)], policy())  # warm-up
    walls: dict = {name: [] for name, *_ in loads}
    last: dict = {}
    reference = None
    for rep in range(args.reps):
        for name, p, pol in loads:
            t0 = time.perf_counter()
            out = _testing.generate_with_policy(ctx._ctx, texts, p, pol)
            walls[name].append(time.perf_counter() - t0)
            tokens = [list(c.token_ids) for c in out]
            if reference is None and p is own:
                reference = tokens
            same = sum(a == b for a, b in zip(reference, tokens)) if p is own else None
            last[name] = (ctx.last_stats, same)
            print(json.dumps({"rep": rep, "load": name, "wall_s": round(walls[name][-1], 3)}), flush=True)
    results = {"what": "refills in waves on outputs of different lengths",
               "machine": f"{platform.machine()}, {os.cpu_count()} cores", "model": os.path.basename(args.model),
               "prompts": args.prompts, "slots": args.slots, "mean_length": mean, "loads": []}
    lock_rate = None
    for name, *_ in loads:
        s, same = last[name]
        wall = statistics.median(walls[name])
        rate = s.n_gen_tokens / wall
        lock_rate = lock_rate or rate
        row = {"load": name, "wall_s": [round(w, 3) for w in walls[name]], "median_wall_s": round(wall, 3),
               "gen_tok_s": round(rate, 1), "x_lockstep": round(rate / lock_rate, 3),
               "decode_calls": s.n_decode_calls, "ms_per_call": round(1000 * wall / s.n_decode_calls, 2),
               "same_outputs": same}
        results["loads"].append(row)
        print(json.dumps(row), flush=True)
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
