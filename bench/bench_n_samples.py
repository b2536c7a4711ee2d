"""n samples of one prompt against copies of it: one prompt of 256 tokens, 8 samples of 64
new tokens each (temperature 0.8, ignore_eos), on an 8-slot context.

    python bench/bench_n_samples.py                       # CPU
    python bench/bench_n_samples.py --out bench/results/cpu-x86_64-2core-n-samples.json

Three settings, each on its own context: `n=8` (the prompt once with SamplingParams(n=8)),
8 copies of the prompt with seeds seed..seed+7 and share_prefixes=False, and the same 8
copies with share_prefixes=True. The three run interleaved, `--reps` rounds after one
warm-up round; medians per setting.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time

import fastpar

SEED = 1000


def make_prompt(model: fastpar.Model, n_tokens: int) -> str:
    """A prompt of exactly n_tokens tokens (words added one at a time)."""
    words = ("Read the report below and answer the question that follows it carefully. " * 40).split()
    text = ""
    for w in words:
        longer = (text + " " + w) if text else w
        if len(model.tokenize(longer)) > n_tokens:
            break
        text = longer
    assert len(model.tokenize(text)) == n_tokens, len(model.tokenize(text))
    return text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-gpu-layers", type=int, default=0)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args()
    model = fastpar.Model(fastpar.default_model_path(), n_gpu_layers=args.n_gpu_layers)
    prompt = make_prompt(model, args.prompt_tokens)
    opts = dict(temperature=0.8, max_tokens=args.max_tokens, ignore_eos=True)
    n = args.n

    def ctx(share: bool) -> fastpar.Context:
        return fastpar.Context(model, n_parallel=n, n_ctx_per_seq=args.prompt_tokens + args.max_tokens + 16,
                               share_prefixes=share)

    copies = [fastpar.SamplingParams(seed=SEED + j, **opts) for j in range(n)]
    settings = {
        "n_samples": (ctx(False), lambda c: fastpar.generate_parallel(
            c, [prompt], fastpar.SamplingParams(n=n, seed=SEED, **opts))[0]),
        "copies_no_sharing": (ctx(False), lambda c: fastpar.generate_parallel(c, [prompt] * n, copies)),
        "copies_sharing": (ctx(True), lambda c: fastpar.generate_parallel(c, [prompt] * n, copies)),
    }
    times = {name: [] for name in settings}
    stats = {}
    outputs = {}
    for rep in range(args.reps + 1):
        for name, (c, run) in settings.items():
            t0 = time.perf_counter()
            out = run(c)
            dt = time.perf_counter() - t0
            if rep > 0:  # round 0 warms up
                times[name].append(dt)
            stats[name] = c.last_stats.to_dict()
            outputs[name] = [x.token_ids for x in out]
    # Sample j is seeded SEED + j: on the CPU the same tokens as copy j with sharing on (the
    # same batch shapes); without sharing the prompt's last token rounds differently.
    same = outputs["n_samples"] == outputs["copies_sharing"]
    med = {name: statistics.median(t) for name, t in times.items()}
    print(f"fastpar {fastpar.__version__} ({fastpar.backend()}), {platform.machine()}, one prompt of "
          f"{args.prompt_tokens} tokens, {n} samples x {args.max_tokens} new tokens, n_parallel={n}")
    for name in settings:
        s = stats[name]
        print(f"{name:18s} median {med[name]:.3f} s (runs {', '.join(f'{x:.3f}' for x in times[name])}); "
              f"prompt tokens decoded {s['n_prompt_tokens']}, shared {s['n_prompt_tokens_shared']}, "
              f"generated {s['n_gen_tokens']}")
    ratio = med["n_samples"] / med["copies_no_sharing"]
    print(f"n={n} / copies without sharing: {ratio:.2f}x the time (bar: <= 0.70); "
          f"copies with sharing / n={n}: {med['copies_sharing'] / med['n_samples']:.2f}x; "
          f"samples equal the seeded copies with sharing: {same}")
    if args.out:
        result = {
            "what": f"n={n} samples of one {args.prompt_tokens}-token prompt vs {n} seeded copies, "
                    f"{args.max_tokens} new tokens each, temperature 0.8, ignore_eos",
            "command": " ".join(["python", "bench/bench_n_samples.py", *sys.argv[1:]]),
            "fastpar": fastpar.__version__, "backend": fastpar.backend(), "machine": platform.machine(),
            "n": n, "prompt_tokens": args.prompt_tokens, "max_tokens": args.max_tokens, "reps": args.reps,
            "median_s": med, "runs_s": times, "stats_last_run": stats,
            "ratio_n_over_copies_no_sharing": ratio, "samples_equal_seeded_copies_sharing": same,
        }
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
