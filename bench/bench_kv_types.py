"""KV-cache types: what q8_0 and q4_0 keys and values cost in perplexity and speed, and
what they save in memory, against the default f16.

    python bench/bench_kv_types.py                          # f16, q8_0, q4_0; default model, CPU
    python bench/bench_kv_types.py --gpu --model speed.gguf  # a CUDA build, every layer on the GPU

For each type (the same for K and V), in a fresh process: a Context of --n-parallel slots
of --n-ctx-per-seq positions; the KV cache's size as llama.cpp reports it at creation
(FASTPAR_VERBOSE's "llama_kv_cache: size = ... MiB" line) and whether flash attention was
on; `fastpar.perplexity` at n_ctx --ppl-ctx on the pinned llama.cpp's own Markdown (as
bench/bench_scoring.py: the same bytes wherever the vendored copy is the pinned one, cut
to --ppl-tokens tokens); and generation speed: one prompt a slot, --gen-tokens new tokens
each (ignore_eos), --reps calls, the median of `Stats.gen_tokens_per_s`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys

TYPES = ["f16", "q8_0", "q4_0"]


def one(args: argparse.Namespace) -> dict:
    import fastpar

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_scoring import ppl_text

    path = args.model or fastpar.default_model_path()
    model = fastpar.Model(path, n_gpu_layers=-1 if args.gpu else 0)
    text, n_tokens, _ = ppl_text(model, args.ppl_tokens)
    ctx = fastpar.Context(model, n_parallel=args.n_parallel, n_ctx_per_seq=args.n_ctx_per_seq,
                          n_threads=args.n_threads, type_k=args.one, type_v=args.one)
    ppl = fastpar.perplexity(ctx, text, n_ctx=args.ppl_ctx)
    prompts = [f"Write a long story about the number {i}." for i in range(args.n_parallel)]
    speeds = []
    for _ in range(args.reps):
        fastpar.generate_parallel(ctx, prompts, max_tokens=args.gen_tokens, ignore_eos=True, temperature=0.0)
        speeds.append(ctx.last_stats.gen_tokens_per_s)
    return {"type": args.one, "ppl": ppl.perplexity, "ppl_std_error": ppl.std_error, "n_scored": ppl.n_scored,
            "text_tokens": n_tokens, "gen_tok_s": statistics.median(speeds), "backend": fastpar.backend()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="GGUF file (default: the default model)")
    p.add_argument("--gpu", action="store_true", help="every layer on the GPU (a CUDA build)")
    p.add_argument("--types", default=",".join(TYPES))
    p.add_argument("--n-parallel", type=int, default=8)
    p.add_argument("--n-ctx-per-seq", type=int, default=2048)
    p.add_argument("--n-threads", type=int, default=None)
    p.add_argument("--ppl-ctx", type=int, default=512)
    p.add_argument("--ppl-tokens", type=int, default=16384)
    p.add_argument("--gen-tokens", type=int, default=64)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # the child: one type
    args = p.parse_args()
    if args.one:
        print(json.dumps(one(args)))
        return 0
    rows = []
    argv = []  # this command's options, less --types, for each child
    skip = False
    for a in sys.argv[1:]:
        if not skip and not a.startswith("--types"):
            argv.append(a)
        skip = a == "--types"
    for t in args.types.split(","):
        run = subprocess.run([sys.executable, __file__, *argv, "--one", t], capture_output=True, text=True,
                             env={**os.environ, "FASTPAR_VERBOSE": "1"})
        if run.returncode != 0:
            print(run.stderr[-3000:], file=sys.stderr)
            return 1
        row = json.loads(run.stdout.strip().splitlines()[-1])
        kv = re.search(r"llama_kv_cache: size = +([0-9.]+) MiB", run.stderr)
        row["kv_mib"] = float(kv.group(1)) if kv else float("nan")
        # auto resolved ("Flash Attention enabled"), or turned on for a quantized V cache
        fa = re.search(r"Flash Attention (enabled|disabled)|(enabling flash_attn)", run.stderr)
        row["flash_attn"] = "?" if not fa else "off" if fa.group(1) == "disabled" else "on"
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)
    base = rows[0]
    print(f"backend {base['backend']}; {args.n_parallel} slots x {args.n_ctx_per_seq} positions; perplexity at "
          f"n_ctx {args.ppl_ctx} over {base['n_scored']} scored tokens of {base['text_tokens']}\n")
    print("| K and V | KV cache | vs " + base["type"] + " | perplexity | vs " + base["type"] +
          " | gen tok/s | flash attention |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['type']} | {r['kv_mib']:.1f} MiB | {r['kv_mib'] / base['kv_mib']:.2f}x | "
              f"{r['ppl']:.4f} +/- {r['ppl_std_error']:.4f} | {100 * (r['ppl'] / base['ppl'] - 1):+.2f} % | "
              f"{r['gen_tok_s']:.1f} | {r['flash_attn']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
