#!/usr/bin/env python3
"""nano-vllm's benchmark workload: 256 sequences of random prompt and output lengths.

The load of nano-vllm's `bench.py` (and mini-sglang's offline bench, adapted from it), made
with the same calls to Python's `random` after `seed(0)`, so the lengths are theirs (133,966
output tokens in all): 256 prompts of 100-1,024 random token ids below 10,000, each
generating 100-1,024 tokens (temperature 0.6, ignore_eos), every sequence at once (256
slots, 2,048 cells each). Their throughput is the output tokens over the wall time of the
one generate call; so is this one's.

Beside it, in the same process and taking turns with it, the same prompts generating their
mean output length each (a lockstep load of as many tokens), and raw llama.cpp's own
lockstep wave of that shape (`llama-batched-bench`, 256 sequences of the mean prompt and
output lengths, same build, model and batch): a ceiling no random-length load reaches.

    python bench/bench_random_lengths.py --model SPEED_MODEL.gguf --batched-bench PATH [--reps 3]

The model is meant to be Qwen3-0.6B's shape (`bench/make_speed_model.py --type F16`), every
layer on the GPU. Published numbers for this workload (other machines; not run here):
docs/performance.md.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pathlib
import platform
import random
import statistics
import sys
import time

import fastpar

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import run as bench_run  # noqa: E402 - llama-batched-bench's runner and batch sizes


def workload(n_seqs: int, max_input: int, max_output: int):
    """nano-vllm's bench.py, call for call: prompts first, then each one's output length."""
    random.seed(0)
    prompts = [[random.randint(0, 10000) for _ in range(random.randint(100, max_input))] for _ in range(n_seqs)]
    lengths = [random.randint(100, max_output) for _ in range(n_seqs)]
    return prompts, lengths


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="GGUF (Qwen3-0.6B's shape: make_speed_model.py --type F16)")
    ap.add_argument("--batched-bench", default=None,
                    help="llama-batched-bench from the same vendored source (default: built by bench/run.py's rules)")
    ap.add_argument("--seqs", type=int, default=256)
    ap.add_argument("--max-len", type=int, default=1024, help="longest prompt and longest output")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--n-gpu-layers", type=int, default=-1)
    ap.add_argument("--longest-first", action="store_true",
                    help="also the same load with the prompts ordered by output length, longest first")
    ap.add_argument("--no-raw", action="store_true", help="leave out llama-batched-bench")
    ap.add_argument("--prefix-cache-mib", type=int, default=0,
                    help="the context's prefix cache (-1: fastpar serve's default); cleared before each call, "
                         "so that only what it does within a call counts (finished slots keep their sequences)")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args()

    gpu = args.n_gpu_layers != 0
    bench_run.Target.gpu = gpu
    if args.batched_bench is None and not args.no_raw:
        if gpu:
            bench_run.Target.baselines = bench_run.ROOT / "build" / "baselines-cuda"
        args.batched_bench = bench_run.build_baselines(server=False)["llama-batched-bench"]

    prompts, lengths = workload(args.seqs, args.max_len, args.max_len)
    mean_prompt = round(statistics.mean(len(p) for p in prompts))
    mean_out = round(statistics.mean(lengths))
    total = sum(lengths)
    model = fastpar.Model(args.model, n_gpu_layers=args.n_gpu_layers)

    def make_context():
        c = fastpar.Context(model, n_parallel=args.seqs, n_ctx_per_seq=2 * args.max_len,
                            prefix_cache_mib=args.prefix_cache_mib)
        # Warm-up, as theirs ("Benchmark: "), and once at full width: a GPU context's first
        # steps of each shape pay one-time costs (kernels loaded, pools grown).
        fastpar.generate_parallel(c, ["Benchmark: "])
        fastpar.generate_parallel(c, [p[:128] for p in prompts], max_tokens=32, ignore_eos=True)
        return c

    held = [make_context()]  # freed while raw llama.cpp runs on a GPU (below)
    own = [fastpar.SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=n, seed=i)
           for i, n in enumerate(lengths)]
    lockstep = [fastpar.SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=mean_out, seed=i)
                for i in range(args.seqs)]

    def fastpar_load(params, order=None):
        order = order or list(range(args.seqs))
        ordered_prompts, ordered_params = [prompts[i] for i in order], [params[i] for i in order]

        def go():
            ctx = held[0]
            if args.prefix_cache_mib:
                ctx.clear_prefix_cache()
            t0 = time.perf_counter()
            out = fastpar.generate_parallel(ctx, ordered_prompts, ordered_params)
            wall = time.perf_counter() - t0
            failed = [c.error for c in out if c.finish_reason == "error"]
            if failed:
                raise SystemExit(f"{len(failed)} prompts failed: {failed[0]}")
            made = sum(c.n_gen_tokens for c in out)
            return wall, made, ctx.last_stats.n_decode_calls
        return go

    def raw_lockstep():
        # One process, a warm-up wave, then the wave that counts (its T: prompts and outputs).
        # On a GPU fastpar's context (256 x 2,048 positions, ~60 GB of the speed model's KV)
        # is freed first, or both do not fit an 80 GB card; it is made again after.
        if gpu:
            held[0] = None
            gc.collect()
        runs = bench_run.batched_bench(args.batched_bench, args.model, args.seqs, mean_prompt, mean_out, 2,
                                       os.cpu_count(), gpu)
        if gpu:
            held[0] = make_context()
        return runs[-1][2], args.seqs * mean_out, None

    loads = [("fastpar, random lengths (nano-vllm's load)", fastpar_load(own)),
             ("fastpar, lockstep at the mean lengths", fastpar_load(lockstep)),
             ("raw llama.cpp lockstep wave (llama-batched-bench)", raw_lockstep)]
    if args.no_raw:
        loads.pop()
    if args.longest_first:
        # Slot i gets prompt i when all are admitted at once: ordered so, the sequences still
        # running always hold the first slots, one run of consecutive seq_ids (no gaps).
        longest = sorted(range(args.seqs), key=lambda i: -lengths[i])
        loads.insert(1, ("fastpar, random lengths, longest outputs first", fastpar_load(own, longest)))
    rows: dict = {name: [] for name, _ in loads}
    for rep in range(args.reps):
        for name, go in loads:
            wall, made, calls = go()
            rows[name].append(dict(wall_s=round(wall, 2), tok_s=round(made / wall, 1), gen_tokens=made,
                                   decode_calls=calls))
            print(json.dumps({"rep": rep, "load": name, **rows[name][-1]}), flush=True)

    first = loads[0][0]
    median = {name: statistics.median(r["tok_s"] for r in runs) for name, runs in rows.items()}
    if args.prefix_cache_mib:
        print(f"prefix cache: {held[0].prefix_cache_stats()}")
    print(f"\n{args.seqs} sequences, prompts {mean_prompt} and outputs {mean_out} tokens on average, "
          f"{total} output tokens; medians of {args.reps}:")
    for name, _ in loads:
        ratio = statistics.median(a["tok_s"] / b["tok_s"] for a, b in zip(rows[first], rows[name]))
        print(f"  {name:52s} {median[name]:9.1f} output tok/s   random lengths x {ratio:.2f} (paired)")
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(dict(
            what="nano-vllm's benchmark workload", machine=f"{platform.machine()}, {os.cpu_count()} cores",
            model=os.path.basename(args.model), prefix_cache_mib=args.prefix_cache_mib, seqs=args.seqs, mean_prompt=mean_prompt, mean_output=mean_out,
            output_tokens=total, reps=rows, median_tok_s=median), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
