"""Where a call's time goes, beside raw llama.cpp's own split of its run.

    python bench/bench_breakdown.py --gpu                        # F16 and Q4_K_M, 1, 8, 32 slots, 4 reps
    python bench/bench_breakdown.py --gpu --models F16 --parallel 32 --reps 6

The GPU table's workload (bench/run.py): one 32-token prompt a slot, 50 new tokens each
(ignore_eos), the speed model. For every repetition, in turn: one `llama-batched-bench`
process running the workload three times (its T_PP, T_TG and T of each run; the second
and third count), then for each setting (greedy and typical with the default sampling
place, then the other place) a fresh Context and three calls on it. A call is split with
`ctx.last_stats`: the prompt's share of the decodes (`t_prompt_ms`, against raw's T_PP),
generation (`t_gen_ms`: the other decodes plus choosing and accepting tokens, against
raw's T_TG) with choosing tokens (`t_sample_ms`) on its own, and what is left of the
call's wall time; and a generation step without choosing tokens (generation less choosing
tokens, over the decodes after the prompt's) against one of raw's T_TG decodes. Prints
every row as it comes, then medians: raw's later runs against each Context's later calls,
and against first calls.

Needs the baselines built by `bench/run.py` (`--gpu`: build/baselines-cuda) and a CUDA
build of fastpar for --gpu.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import time

import fastpar

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from make_speed_model import build  # noqa: E402
from run import batched_bench, make_prompts, request_params  # noqa: E402  (same prompts, requests and raw run as the table)

PROMPT, GEN = 32, 50


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", action="store_true", help="every layer on the GPU; baselines in build/baselines-cuda")
    ap.add_argument("--models", default="F16,Q4_K_M", help="speed model types")
    ap.add_argument("--parallel", default="1,8,32")
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--threads", type=int, default=None, help="llama-batched-bench -t (default: one per CPU)")
    args = ap.parse_args()
    baselines = HERE.parent / "build" / ("baselines-cuda" if args.gpu else "baselines") / "bin"
    n_gpu_layers = -1 if args.gpu else 0
    threads = args.threads or len(os.sched_getaffinity(0))
    out: dict = {}
    for q in args.models.split(","):
        path = str(build(str(baselines / "llama-quantize"), q))
        model = fastpar.Model(path, n_gpu_layers=n_gpu_layers)
        for n_par in (int(p) for p in args.parallel.split(",")):
            prompts = make_prompts(model, n_par, PROMPT, 0)
            # The default sampling place, then the other one ("other": the opposite of what
            # the default chose), so that each level shows what device sampling's ops and
            # copies cost a step against host sampling's whole rows.
            settings = [("greedy", None), ("typical", None), ("greedy", "other"), ("typical", "other")]
            auto = None
            for rep in range(args.reps):
                raw = [[round(t * 1000, 1) for t in run] for run in
                       batched_bench(str(baselines / "llama-batched-bench"), path, n_par, PROMPT, GEN, 3, threads,
                                     args.gpu)]
                print(f"RAW {q} np{n_par} rep{rep}: (T_PP, T_TG, T) ms per run {raw}", flush=True)
                out.setdefault((q, n_par, "raw"), []).extend(raw[1:])
                for sampler, device_sampling in settings:
                    if device_sampling == "other":
                        device_sampling = not auto
                    t0 = time.perf_counter()
                    ctx = fastpar.Context(model, n_parallel=n_par, n_ctx_per_seq=PROMPT + GEN + 8,
                                          device_sampling=device_sampling)
                    row = [round((time.perf_counter() - t0) * 1000, 1)]
                    if auto is None:
                        auto = ctx.device_sampling
                    for _ in range(3):
                        t0 = time.perf_counter()
                        fastpar.generate_parallel(ctx, prompts, **request_params(GEN, sampler))
                        wall = (time.perf_counter() - t0) * 1000
                        s = ctx.last_stats
                        row.append([round(wall, 1), round(s.t_prompt_ms, 1), round(s.t_gen_ms, 1),
                                    round(s.t_sample_ms, 1), s.n_decode_calls, s.n_device_sampled])
                    tag = f"{sampler}/ds={ctx.device_sampling}"
                    print(f"FP  {q} np{n_par} rep{rep} {tag}: create {row[0]} | calls [wall, prompt, gen, sample, "
                          f"decodes, devsampled] {row[1:]}", flush=True)
                    out.setdefault((q, n_par, tag), []).append(row)
                    del ctx
        del model
    print("\nSUMMARY (medians; raw = runs 2-3 of each process; fastpar = calls 2-3 and call 1 of each Context)")
    for (q, n_par, tag), rows in out.items():
        if tag == "raw":
            continue
        raw = out[(q, n_par, "raw")]
        rt, rpp, rtg = (statistics.median(r[k] for r in raw) for k in (2, 0, 1))
        later = [c for row in rows for c in row[2:]]
        first = [row[1] for row in rows]
        w, p, g, sm = (statistics.median(c[k] for c in later) for k in range(4))
        w1 = statistics.median(c[0] for c in first)
        # A generation step without choosing tokens: fastpar's decodes after the prompt's
        # (each call decodes the prompt, then GEN - 1 steps) against raw's GEN decodes in T_TG.
        step = statistics.median((c[2] - c[3]) / (c[4] - 1) for c in later)
        print(f"{q:6s} np{n_par:<3d} {tag:22s} raw T {rt:6.1f} (PP {rpp:5.1f} TG {rtg:6.1f}) | fp wall {w:6.1f} "
              f"first {w1:6.1f} (prompt {p:5.1f} gen {g:6.1f} of which sample {sm:5.1f}; other {w - p - g:5.1f}) | "
              f"step {step:5.3f} raw {rtg / GEN:5.3f} | raw/fp later {rt / w:.3f} first {rt / w1:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
