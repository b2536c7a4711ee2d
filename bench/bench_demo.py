#!/usr/bin/env python3
"""Batched versus one-at-a-time on the demo's 8 chat prompts (48 new tokens each).

Both runs use the same model, the same prompts and the same process; "one at a time"
is fastpar itself with n_parallel=1, one prompt per call. Each prompt generates exactly
48 tokens (ignore_eos), greedy. Prints the median of --repeats runs of each, and the
ratio, and writes them to bench/results/cpu-<machine>-<N>core-demo.json.

    python bench/bench_demo.py [--repeats 3] [--model PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import time

import fastpar
from fastpar.__main__ import DEMO_QUESTIONS

MAX_TOKENS = 48


def run_batched(model: fastpar.Model, prompts, n_threads) -> float:
    ctx = fastpar.Context(model, n_parallel=len(prompts), n_ctx_per_seq=512, n_threads=n_threads)
    t0 = time.perf_counter()
    results = fastpar.generate_parallel(ctx, prompts, max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    dt = time.perf_counter() - t0
    assert all(c.n_gen_tokens == MAX_TOKENS for c in results)
    return dt


def run_one_at_a_time(model: fastpar.Model, prompts, n_threads) -> float:
    ctx = fastpar.Context(model, n_parallel=1, n_ctx_per_seq=512, n_threads=n_threads)
    t0 = time.perf_counter()
    for p in prompts:
        (c,) = fastpar.generate_parallel(ctx, [p], max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
        assert c.n_gen_tokens == MAX_TOKENS
    return time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", default=None)
    parser.add_argument("--n-threads", type=int, default=None)
    parser.add_argument("--out", default=None, help="JSON path (default bench/results/cpu-<machine>-<N>core-demo.json)")
    args = parser.parse_args()

    model = fastpar.Model(args.model or fastpar.default_model_path())
    prompts = [[{"role": "user", "content": q}] for q in DEMO_QUESTIONS]
    run_batched(model, prompts, args.n_threads)  # warm-up: page in the weights, size the buffers
    batched, single = [], []
    for _ in range(args.repeats):  # interleaved, so drift on a noisy machine hits both alike
        batched.append(run_batched(model, prompts, args.n_threads))
        single.append(run_one_at_a_time(model, prompts, args.n_threads))
    n_tokens = len(prompts) * MAX_TOKENS
    med_b, med_s = statistics.median(batched), statistics.median(single)
    result = {
        "workload": f"{len(prompts)} demo chat prompts, {MAX_TOKENS} new tokens each, greedy, ignore_eos",
        "model": model.description,
        "backend": fastpar.backend(),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "fastpar": fastpar.__version__,
        "batched_s": batched,
        "one_at_a_time_s": single,
        "batched_gen_tok_per_s": n_tokens / med_b,
        "one_at_a_time_gen_tok_per_s": n_tokens / med_s,
        "speedup_median": med_s / med_b,
        "command": "python bench/bench_demo.py --repeats %d" % args.repeats,
    }
    print(f"n_parallel=8, one call : median {med_b:.2f} s  ({n_tokens / med_b:.1f} generated tok/s)  runs {batched}")
    print(f"n_parallel=1, 8 calls  : median {med_s:.2f} s  ({n_tokens / med_s:.1f} generated tok/s)  runs {single}")
    print(f"speed-up (median)      : {med_s / med_b:.2f}x")
    out = pathlib.Path(args.out) if args.out else (
        pathlib.Path(__file__).parent / "results" / f"cpu-{platform.machine()}-{os.cpu_count()}core-demo.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
