"""A fresh Context's first call against its later ones, with and without the warm-up
decodes at creation (Context(warmup=...)).

    python bench/bench_first_call.py --model PATH --n-gpu-layers -1 --parallel 8,32 --reps 3

The GPU table's workload (bench/run.py): one prompt of 32 tokens a slot, 50 new tokens
each (ignore_eos), greedy and typical. For every repetition and setting, in turn: make a
Context (timed: this includes the warm-up), then time three calls on it. Prints each
Context's row as it comes (creation, call 1, 2, 3), then medians over the repetitions and
call 1 / call 3.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import pathlib

import fastpar

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from run import make_prompts, request_params  # noqa: E402  (same prompts and requests as the table)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="GGUF file (default: the default model)")
    ap.add_argument("--n-gpu-layers", type=int, default=0)
    ap.add_argument("--parallel", default="8,32")
    ap.add_argument("--samplers", default="greedy,typical")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    path = args.model or fastpar.default_model_path()
    model = fastpar.Model(path, n_gpu_layers=args.n_gpu_layers)
    print(f"fastpar {fastpar.__version__} ({fastpar.backend()}), {pathlib.Path(path).name}, "
          f"n_gpu_layers={args.n_gpu_layers}")
    for n_par in (int(p) for p in args.parallel.split(",")):
        prompts = make_prompts(model, n_par, 32, 0)
        for sampler in args.samplers.split(","):
            times: dict = {False: [], True: []}
            for _ in range(args.reps):
                for warmup in (False, True):  # interleaved: drift hits both alike
                    t0 = time.perf_counter()
                    ctx = fastpar.Context(model, n_parallel=n_par, n_ctx_per_seq=32 + 50 + 8, warmup=warmup)
                    row = [time.perf_counter() - t0]
                    for _ in range(3):
                        t0 = time.perf_counter()
                        fastpar.generate_parallel(ctx, prompts, **request_params(50, sampler))
                        row.append(time.perf_counter() - t0)
                    times[warmup].append(row)
                    del ctx
                    # Each Context as it comes too: whether later ones in a process run slower.
                    print(f"  context {len(times[False]) + len(times[True])} warmup={str(warmup):5s}: "
                          + " ".join(f"{x * 1e3:7.1f}" for x in row) + " ms", flush=True)
            for warmup, rows in times.items():
                med = [statistics.median(col) * 1e3 for col in zip(*rows)]
                print(f"n_parallel={n_par} {sampler:7s} warmup={str(warmup):5s}: create {med[0]:7.1f} ms | calls "
                      f"{med[1]:7.1f} {med[2]:7.1f} {med[3]:7.1f} ms | call 1 / call 3 {med[1] / med[3]:.3f}",
                      flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
