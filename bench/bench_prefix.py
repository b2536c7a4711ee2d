"""Prefix sharing on and off: prompts with a common prefix of about 290 tokens, each with
its own question, 64 new tokens each (greedy, ignore_eos).

    python bench/bench_prefix.py                                   # CPU
    python bench/bench_prefix.py --n-gpu-layers -1 --prompts 64 --parallel 8,64

Medians of 3 calls per setting, after one warm-up call, all in one process.
"""

from __future__ import annotations

import argparse
import statistics
import time

import fastpar


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-gpu-layers", type=int, default=0)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--parallel", default="8")
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    model = fastpar.Model(fastpar.default_model_path(), n_gpu_layers=args.n_gpu_layers)
    prefix = "Read the report below and answer the question that follows it. " * 24
    prompts = [prefix + f" Question {i}: what is {i} times {i + 3}?" for i in range(args.prompts)]
    print(f"fastpar {fastpar.__version__} ({fastpar.backend()}), {args.prompts} prompts of "
          f"{len(model.tokenize(prompts[0]))} tokens, {len(model.tokenize(prefix))} of them common")
    for n_par in (int(p) for p in args.parallel.split(",")):
        med = {}
        for share in (False, True):
            ctx = fastpar.Context(model, n_parallel=n_par, n_ctx_per_seq=512, share_prefixes=share)
            fastpar.generate_parallel(ctx, prompts[:n_par], max_tokens=8, temperature=0.0)  # warm-up
            times = []
            for _ in range(3):
                t0 = time.perf_counter()
                fastpar.generate_parallel(ctx, prompts, max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
                times.append(time.perf_counter() - t0)
            s = ctx.last_stats
            med[share] = statistics.median(times)
            print(f"n_parallel={n_par} share_prefixes={share}: median {med[share]:.3f} s "
                  f"(runs {', '.join(f'{x:.3f}' for x in times)}), prompt tokens decoded {s.n_prompt_tokens}, "
                  f"shared {s.n_prompt_tokens_shared}, generated {s.n_gen_tokens}")
        print(f"n_parallel={n_par}: sharing is {med[False] / med[True]:.2f}x faster")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
