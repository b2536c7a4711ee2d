#!/usr/bin/env python3
"""Few-shot extraction in chunks: one Context's prefix cache on (prefix_cache_mib=-1) and off
(its default, prefix_cache_mib=0) on a job whose calls all begin with the same long prefix.

The job: --prompts prompts (default 400), each a --prefix-tokens few-shot prefix (default
1,500, the same in every prompt) followed by a document of its own (--doc-tokens, default
50), run as --prompts / --chunk `generate_parallel` calls of --chunk prompts (default 20)
on one Context, each prompt asking for --new-tokens new tokens (default 16, greedy,
ignore_eos). Both settings share a common prefix within a call (share_prefixes, the
default), so with the cache off each call decodes the prefix once and every document;
with it on the ideal is the prefix once in the whole job and every document once
(prefix + prompts x doc tokens). --parallel defaults to --chunk: a user sizing a Context
for calls of 20 prompts gives it a slot for each, so that a call is one wave.

Each job gets a new Context (its creation is not timed) and runs both settings in turn,
the order swapped every repetition; medians of --reps repetitions (default 3). Reported:
the whole job's seconds, the ratio on / off (the median of that ratio within a repetition;
target <= 0.35), prompt tokens decoded (the sum of last_stats.n_prompt_tokens over the
calls) against the ideal (target <= 1.1x) and prompt tokens taken from the cache
(last_stats.n_prompt_tokens_cached). Texts are common words counted with the model's
tokenizer (bench/run.py make_prompts).

--kv-unified adds a third setting, the cache on with one KV buffer for all slots
(Context's kv_unified): a step's documents are then rows of one KV stream, which llama.cpp's
CPU flash attention takes through its tiled kernel; with a buffer per slot a 50-token
document is too few rows a stream for it (docs/internals.md, "The prefix cache").

    python bench/bench_fewshot.py                     # 400 prompts in 20 calls of 20, CPU, 3 repetitions
    python bench/bench_fewshot.py --gpu --out fewshot.md
    python bench/bench_fewshot.py --kv-unified        # also the cache on a unified KV
    python bench/bench_fewshot.py --quick             # tiny sizes: checks the harness
"""

from __future__ import annotations

import argparse
import os
import pathlib
import platform
import statistics
import sys
import time

import fastpar

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import run as bench_run  # noqa: E402  (make_prompts, gpu_name)

# Each setting's Context keywords: the cache on (auto budget) and off (the default), and the
# cache on a unified KV (run with --kv-unified only).
UNIFIED = "cache on, unified KV"
SETTINGS = {"cache off": dict(prefix_cache_mib=0), "cache on": dict(prefix_cache_mib=-1),
            UNIFIED: dict(prefix_cache_mib=-1, kv_unified=True)}


def job(model: fastpar.Model, prompts: list, args, setting: str) -> dict:
    """The whole job on a new Context -> its seconds and the sums of its calls' statistics."""
    ctx = fastpar.Context(model, n_parallel=args.parallel, n_ctx_per_seq=args.prefix_tokens + args.doc_tokens +
                          args.new_tokens + 8, n_threads=args.threads, **SETTINGS[setting])
    sums = dict(decoded=0, cached=0, shared=0, gen=0)
    t0 = time.perf_counter()
    for i in range(0, len(prompts), args.chunk):
        fastpar.generate_parallel(ctx, prompts[i:i + args.chunk], max_tokens=args.new_tokens, temperature=0.0,
                                  ignore_eos=True)
        s = ctx.last_stats
        sums["decoded"] += s.n_prompt_tokens
        sums["cached"] += s.n_prompt_tokens_cached
        sums["shared"] += s.n_prompt_tokens_shared
        sums["gen"] += s.n_gen_tokens
    return dict(wall=time.perf_counter() - t0, **sums)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=400)
    ap.add_argument("--chunk", type=int, default=20, help="prompts in one generate_parallel call")
    ap.add_argument("--prefix-tokens", type=int, default=1500)
    ap.add_argument("--doc-tokens", type=int, default=50)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--parallel", type=int, default=None, help="the Context's slots (default: --chunk)")
    ap.add_argument("--threads", type=int, default=None, help="default: the Context's (every CPU it may use)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--model", default=None, help="GGUF file (default: fastpar's default model)")
    ap.add_argument("--gpu", action="store_true", help="every layer on the GPU")
    ap.add_argument("--kv-unified", action="store_true", help="also run the cache on with kv_unified=True")
    ap.add_argument("--quick", action="store_true",
                    help="check the harness: 16 prompts in calls of 4, 64 + 16 tokens, 4 new")
    ap.add_argument("--out", default=None, help="also write the markdown table to this file")
    args = ap.parse_args()
    if args.quick:
        args.prompts, args.chunk, args.prefix_tokens, args.doc_tokens, args.new_tokens = 16, 4, 64, 16, 4
    args.parallel = args.parallel or args.chunk
    path = args.model or fastpar.default_model_path()
    model = fastpar.Model(path, n_gpu_layers=-1 if args.gpu else 0)
    prompts = bench_run.make_prompts(model, args.prompts, args.prefix_tokens + args.doc_tokens, args.prefix_tokens)
    ideal = args.prefix_tokens + args.prompts * args.doc_tokens
    print(f"{args.prompts} prompts of {args.prefix_tokens} + {args.doc_tokens} tokens in calls of {args.chunk}, "
          f"{args.parallel} slots, {args.new_tokens} new tokens; ideal prompt tokens decoded {ideal}", flush=True)
    settings = [s for s in SETTINGS if s != UNIFIED or args.kv_unified]
    runs: dict = {s: [] for s in settings}
    for rep in range(args.reps):
        for setting in settings[::-1 if rep % 2 else 1]:  # cache off first: an old fastpar fails at once
            r = job(model, prompts, args, setting)
            runs[setting].append(r)
            print(f"rep {rep} {setting}: {r['wall']:.2f} s, prompt tokens decoded {r['decoded']}, "
                  f"from the cache {r['cached']}, shared within a call {r['shared']}", flush=True)

    ratio = statistics.median(on["wall"] / off["wall"] for on, off in zip(runs["cache on"], runs["cache off"]))
    machine = f"GPU {bench_run.gpu_name()}" if args.gpu else f"CPU {platform.machine()}, {os.cpu_count()} cores"
    lines = ["# Few-shot extraction in chunks: prefix cache on and off", "",
             f"`python bench/bench_fewshot.py {' '.join(sys.argv[1:])}`; fastpar {fastpar.__version__}, {machine}, "
             f"model {pathlib.Path(path).name}; {time.strftime('%Y-%m-%d')}. {args.prompts} prompts of a shared "
             f"{args.prefix_tokens}-token prefix and a {args.doc_tokens}-token document, "
             f"{-(-args.prompts // args.chunk)} calls of {args.chunk} on one Context of {args.parallel} slots, "
             f"{args.new_tokens} new tokens each; "
             f"medians of {args.reps} repetitions. Ideal prompt tokens decoded: {ideal} (the prefix once, every "
             "document once).", "",
             "| setting | job s | prompt tokens decoded | x ideal | from the cache | shared within a call | "
             "generated | runs (s) |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for setting, rs in runs.items():
        def med(key):
            return statistics.median(r[key] for r in rs)
        lines.append(f"| {setting} | {med('wall'):.2f} | {med('decoded'):.0f} | {med('decoded') / ideal:.2f} | "
                     f"{med('cached'):.0f} | {med('shared'):.0f} | {med('gen'):.0f} | "
                     + ", ".join(f"{r['wall']:.2f}" for r in rs) + " |")
    on_decoded = statistics.median(r["decoded"] for r in runs["cache on"]) / ideal
    lines += ["", f"Job time on / off: {ratio:.2f} (target <= 0.35: {'met' if ratio <= 0.35 else 'missed'}); "
                  f"prompt tokens decoded with the cache on: {on_decoded:.2f}x the ideal (target <= 1.1: "
                  f"{'met' if on_decoded <= 1.1 else 'missed'})."]
    if args.kv_unified:
        uni = statistics.median(u["wall"] / off["wall"] for u, off in zip(runs[UNIFIED], runs["cache off"]))
        lines.append(f"With a unified KV: job time on / off {uni:.2f}.")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        pathlib.Path(args.out).write_text(text)
        print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
