#!/usr/bin/env python3
"""Chat-like load: many requests of random prompt and output lengths.

4 x n_parallel requests, prompts of 8 to 150 common words, max_tokens 5 to 150 each
(ignore_eos, greedy), submitted at once to an ``Engine``; slots finish at different times
and take the next request, which is where batch shape matters (docs/internals.md, "The step policy").
The same prompts then go through one ``generate_parallel`` call with max_tokens set to the
mean budget. Prints generated tokens/s (medians of --reps), decode calls and padding.

    python bench/bench_chat.py --n-gpu-layers -1 --parallel 64,256 --reps 2

The model defaults to the F16 speed model (bench/make_speed_model.py, built on first use).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

import fastpar

HERE = Path(__file__).resolve().parent
WORDS = "the of and to in is was for on that with as by at from his her an were are which this be or had".split()


def prompt(i: int, n_words: int) -> str:
    rnd = random.Random(i)
    return " ".join(rnd.choice(WORDS) for _ in range(n_words))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a GGUF file (default: the F16 speed model)")
    parser.add_argument("--n-gpu-layers", type=int, default=0)
    parser.add_argument("--parallel", default="64,256")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    args = parser.parse_args()
    path = args.model
    if path is None:
        sys.path.insert(0, str(HERE))
        from make_speed_model import build

        path = str(build("llama-quantize", "F16"))  # F16 needs no quantizing
    model = fastpar.Model(path, n_gpu_layers=args.n_gpu_layers)
    print(f"model {path}, backend {fastpar.backend()}, n_gpu_layers {args.n_gpu_layers}")
    for npl in (int(p) for p in args.parallel.split(",")):
        rnd = random.Random(7)
        reqs = [(prompt(1000 + i, rnd.randint(8, 150)), rnd.randint(5, 150)) for i in range(4 * npl)]
        gen = sum(m for _, m in reqs)
        for mode in ("engine", "generate"):
            walls, n_gen = [], gen
            for _ in range(args.reps):
                if mode == "engine":
                    with fastpar.Engine(model, n_parallel=npl, n_ctx_per_seq=400, n_threads=args.threads) as eng:
                        t0 = time.perf_counter()
                        handles = [eng.submit(p, max_tokens=m, ignore_eos=True, temperature=0.0) for p, m in reqs]
                        for h in handles:
                            h.result()
                        walls.append(time.perf_counter() - t0)
                        st = eng.stats()
                        extra = f"calls {st.n_decode_calls} padding {st.n_padding_tokens}"
                else:
                    ctx = fastpar.Context(model, n_parallel=npl, n_ctx_per_seq=400, n_threads=args.threads)
                    t0 = time.perf_counter()
                    fastpar.generate_parallel(ctx, [p for p, _ in reqs], max_tokens=gen // len(reqs),
                                              ignore_eos=True, temperature=0.0)
                    walls.append(time.perf_counter() - t0)
                    s = ctx.last_stats
                    n_gen = s.n_gen_tokens  # every prompt gets the mean budget
                    extra = (f"calls {s.n_decode_calls} padding {s.n_padding_tokens} "
                             f"sampling {s.t_sample_ms:.0f} ms of {s.t_wall_ms:.0f}")
            w = statistics.median(walls)
            print(f"chat np{npl} {mode}: {len(reqs)} requests, {n_gen} gen tokens, {w:.2f} s, "
                  f"{n_gen / w:.0f} gen tok/s ({extra})", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
