"""Batch embeddings: fastpar.embed against llama.cpp's own llama-embedding on the same texts.

    python bench/bench_embed.py                       # 2,000 texts, 3 repetitions, CPU
    python bench/bench_embed.py --gpu --texts 10000   # a CUDA build, every layer on the GPU

The model is bge-small's shape (BERT, 12 layers of width 384, 12 heads, FFN 1536, CLS
pooling, 512 positions) with random weights and the real bge vocabulary
(tests/embedding_models.py), F32, cached in $FASTPAR_CACHE/speed-models. The texts are
--texts sentences of random common words, 16 to 256 tokens each (seeded, the same every
run). Each repetition runs every setting once, starting one setting later than the one before
(so drift hits all alike), each in a fresh process timed from its start to its end (model
load included, as a user runs it):

* fastpar: `fastpar.embed` on a Context of --n-parallel slots and --n-batch tokens a batch;
* llama-embedding with the same batch (`-b`, `-ub` = --n-batch; it packs as many texts a
  batch as fit), at its defaults (flash attention auto, as fastpar), and with flash attention
  off, the setting that would make a text's vector independent of its batch-mates on the
  CPU (docs/api.md: what it costs is why fastpar does not use it).

Prints texts/s per setting (median of --reps) and fastpar's ratio to each, as JSON last.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

WORDS = ("time year people way day man thing woman life child world school state family student group country "
         "problem hand part place case week company system program question work government number night point "
         "home water room mother area money story fact month lot right study book eye job word business issue "
         "side kind head house service friend father power hour game line end member law car city community "
         "name president team minute idea kid body information back parent face others level office door health "
         "person art war history party result change morning reason research girl guy moment air teacher force").split()


def model_path() -> str:
    from embedding_models import make_bert
    from fastpar._fetch import cache_dir

    path = cache_dir() / "speed-models" / "bert-bge-small-shape-f32.gguf"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".partial")
        make_bert(tmp, n_layer=12, n_embd=384, n_head=12, n_ff=1536, n_ctx_train=512, pooling="cls")
        tmp.rename(path)
    return str(path)


def texts(n: int, seed: int = 0):
    rng = random.Random(seed)
    # About 1.3 tokens a word with this vocabulary and [CLS]/[SEP]: 12 to 190 words.
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(12, 190))) for _ in range(n)]


def run_fastpar(args, model: str, file: str) -> float:
    code = f"""
import fastpar
texts = open({file!r}).read().split("\\n")
m = fastpar.Model({model!r}, n_gpu_layers={-1 if args.gpu else 0})
ctx = fastpar.Context(m, n_parallel={args.n_parallel}, n_batch={args.n_batch}, n_ctx_per_seq=512, embeddings=True)
rows = fastpar.embed(ctx, texts)
assert not rows.errors, list(rows.errors.items())[:3]
"""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    return time.perf_counter() - t0


def run_llama(args, model: str, file: str, fa: str) -> float:
    from llama_tools import llama_tool

    cmd = [llama_tool("llama-embedding"), "-m", model, "-f", file, "-b", str(args.n_batch), "-ub", str(args.n_batch),
           "-c", str(max(args.n_batch, 512)), "--embd-output-format", "array", "-fa", fa,
           "-ngl", "-1" if args.gpu else "0"]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--texts", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--n-parallel", type=int, default=64)
    ap.add_argument("--n-batch", type=int, default=2048)
    ap.add_argument("--gpu", action="store_true")
    args = ap.parse_args()
    model = model_path()
    items = texts(args.texts)
    with tempfile.TemporaryDirectory() as tmp:
        file = os.path.join(tmp, "texts.txt")
        with open(file, "w") as f:
            f.write("\n".join(items))
        times = {"fastpar": [], "llama-embedding (defaults)": [], "llama-embedding (-fa off)": []}
        runs = {"fastpar": lambda: run_fastpar(args, model, file),
                "llama-embedding (defaults)": lambda: run_llama(args, model, file, "auto"),
                "llama-embedding (-fa off)": lambda: run_llama(args, model, file, "off")}
        names = list(runs)
        for rep in range(args.reps):
            # Each repetition starts one setting later, so that drift hits all alike.
            for name in names[rep % len(names):] + names[:rep % len(names)]:
                times[name].append(runs[name]())
            print(f"rep {rep}: " + ", ".join(f"{k} {v[-1]:.1f} s" for k, v in times.items()), flush=True)
    rate = {k: args.texts / statistics.median(v) for k, v in times.items()}
    for k, v in rate.items():
        print(f"{k:28s} {v:8.1f} texts/s  fastpar x {rate['fastpar'] / v:.2f}")
    print(json.dumps({"texts": args.texts, "reps": args.reps, "n_parallel": args.n_parallel, "n_batch": args.n_batch,
                      "gpu": args.gpu, "texts_per_s": rate, "seconds": times}))


if __name__ == "__main__":
    main()
