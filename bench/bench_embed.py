"""Batch embeddings: fastpar.embed against llama.cpp's own llama-embedding on the same texts.

    python bench/bench_embed.py                       # 2,000 texts, 3 repetitions, CPU
    python bench/bench_embed.py --peers               # and llama-cpp-python's Llama.embed
    python bench/bench_embed.py --gpu --texts 10000 --peers   # a CUDA build; sentence-transformers
    python bench/bench_embed.py --http --clients 32   # fastpar serve against llama-server

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
  CPU (docs/api.md: what it costs is why fastpar does not use it);
* with --peers on the CPU, llama-cpp-python's `Llama.embed(texts)` on the whole list, built
  from the same pinned sdist as fastpar's llama.cpp (bench/run.py's peer venv), at its
  defaults (n_ctx = n_batch = 512, flash attention off) and at its best (n_ctx = n_batch =
  n_ubatch = --n-batch, flash_attn=True, as fastpar);
* with --peers and --gpu, sentence-transformers on the GPU in bfloat16 (a BertModel of the
  same shape with random weights and the same vocabulary, CLS pooling, normalized), at its
  default batch of 32 texts and at 256.

Each process also prints the seconds of its embedding call alone (model loaded), shown as
"in-call" beside the whole process's texts/s. With --http, fastpar serve --embeddings and
llama-server --embeddings (the same model, --n-parallel slots, batch and pooling) each
answer --clients concurrent clients that post one text a request to /v1/embeddings until the
texts run out; the servers start before the clock.

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
    # One token a word (these common words are whole WordPiece tokens), plus [CLS] and [SEP]:
    # 14 to 254 words make 16 to 256 tokens.
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(14, 254))) for _ in range(n)]


def run_fastpar(args, model: str, file: str) -> float:
    code = f"""
import fastpar
texts = open({file!r}).read().split("\\n")
m = fastpar.Model({model!r}, n_gpu_layers={-1 if args.gpu else 0})
ctx = fastpar.Context(m, n_parallel={args.n_parallel}, n_batch={args.n_batch}, n_ctx_per_seq=512, embeddings=True)
import time
t0 = time.perf_counter()
rows = fastpar.embed(ctx, texts)
print("IN-CALL", time.perf_counter() - t0)
assert not rows.errors, list(rows.errors.items())[:3]
"""
    return timed_process([sys.executable, "-c", code])


def timed_process(cmd, capture: bool = True) -> tuple:
    """(the process's wall seconds, the seconds it printed as IN-CALL or None)."""
    with tempfile.TemporaryFile("w+") as err:  # shown when the process fails
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, stdout=subprocess.PIPE if capture else subprocess.DEVNULL, stderr=err, text=True)
        wall = time.perf_counter() - t0
        if proc.returncode:
            err.seek(0)
            sys.stderr.write(err.read()[-4000:])
            proc.check_returncode()
    out = proc.stdout or ""
    inner = [float(line.split()[1]) for line in out.splitlines() if line.startswith("IN-CALL ")]
    return wall, (inner[0] if inner else None)


def run_llama_cpp_python(args, model: str, file: str, n_batch: int) -> tuple:
    sys.path.insert(0, str(ROOT / "bench"))
    import run as bench_run

    sized = "" if n_batch == 0 else f", n_ctx={n_batch}, n_batch={n_batch}, n_ubatch={n_batch}, flash_attn=True"
    code = f"""
import time
from llama_cpp import Llama
texts = open({file!r}).read().split("\\n")
llm = Llama(model_path={model!r}, embedding=True, verbose=False{sized})
t0 = time.perf_counter()
rows = llm.embed(texts, normalize=True)
print("IN-CALL", time.perf_counter() - t0)
assert len(rows) == len(texts)
"""
    return timed_process([bench_run.peer_python(), "-c", code])


def st_model_dir() -> str:
    """bge-small's shape for sentence-transformers: a BertModel with random weights and the
    bge vocabulary (the GGUF's token list as vocab.txt), CLS pooling, normalized."""
    from fastpar._fetch import cache_dir

    path = cache_dir() / "speed-models" / "st-bge-small-shape"
    if (path / "modules.json").exists():
        return str(path)
    import gguf
    from sentence_transformers import SentenceTransformer, models
    from transformers import BertConfig, BertModel, BertTokenizerFast

    from embedding_models import BERT_VOCAB

    hf = path.with_name(path.name + "-hf")
    hf.mkdir(parents=True, exist_ok=True)
    tokens = gguf.GGUFReader(str(BERT_VOCAB)).fields["tokenizer.ggml.tokens"].contents()
    # The GGUF keeps WordPiece in llama.cpp's form ("\u2581word" starts a word, a bare piece
    # continues one); vocab.txt wants "word" and "##piece". transformers 5 ignores vocab_file=
    # in the constructor, so the tokenizer is loaded from the folder's vocab.txt.
    def wordpiece(t: str) -> str:
        if t.startswith("[") and t.endswith("]"):
            return t
        return t[1:] if t.startswith("\u2581") else "##" + t

    (hf / "vocab.txt").write_text("\n".join(wordpiece(t) for t in tokens) + "\n")
    BertTokenizerFast.from_pretrained(str(hf), do_lower_case=True).save_pretrained(hf)
    BertModel(BertConfig(vocab_size=len(tokens), hidden_size=384, num_hidden_layers=12, num_attention_heads=12,
                         intermediate_size=1536, max_position_embeddings=512)).save_pretrained(hf)
    bert = models.Transformer(str(hf), max_seq_length=512)
    SentenceTransformer(modules=[bert, models.Pooling(384, pooling_mode="cls"), models.Normalize()]).save(str(path))
    return str(path)


def run_st(args, file: str, batch_size: int) -> tuple:
    code = f"""
import time, torch
from sentence_transformers import SentenceTransformer
texts = open({file!r}).read().split("\\n")
m = SentenceTransformer({st_model_dir()!r}, device="cuda", model_kwargs={{"torch_dtype": torch.bfloat16}})
t0 = time.perf_counter()
rows = m.encode(texts, batch_size={batch_size})
torch.cuda.synchronize()
print("IN-CALL", time.perf_counter() - t0)
assert rows.shape[0] == len(texts)
"""
    return timed_process([sys.executable, "-c", code])


def run_llama(args, model: str, file: str, fa: str) -> float:
    from llama_tools import llama_tool

    cmd = [llama_tool("llama-embedding"), "-m", model, "-f", file, "-b", str(args.n_batch), "-ub", str(args.n_batch),
           "-c", str(max(args.n_batch, 512)), "--embd-output-format", "array", "-fa", fa,
           "-ngl", "-1" if args.gpu else "0"]
    return timed_process(cmd, capture=False)  # its vectors: tens of MB of text


def http_load(url: str, items: list, clients: int) -> float:
    """Seconds for `clients` concurrent clients to embed every text, one a request."""
    import asyncio

    import httpx

    async def load() -> float:
        queue = list(reversed(items))
        async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=clients)) as http:
            async def client() -> None:
                while queue:
                    r = await http.post(url + "/v1/embeddings", json={"input": queue.pop(), "model": "m"})
                    assert r.status_code == 200 and r.json()["data"][0]["embedding"], r.text[:200]

            t0 = time.perf_counter()
            await asyncio.gather(*(client() for _ in range(clients)))
            return time.perf_counter() - t0

    return asyncio.run(load())


def run_http(args, model: str, items: list) -> dict:
    """fastpar serve and llama-server, each started once, answering the load in turns."""
    sys.path.insert(0, str(ROOT / "bench"))
    import bench_server
    import run as bench_run
    from llama_tools import llama_tool

    bench_run.Target.gpu, bench_run.Target.n_gpu_layers = args.gpu, -1 if args.gpu else 0
    threads = os.cpu_count() or 1
    servers = {"fastpar serve": bench_server.fastpar_server(model, args.n_parallel, 512, threads, ["--embeddings"]),
               "llama-server": bench_server.llama_server(llama_tool("llama-server"), model, args.n_parallel, 512, threads,
                                                         ["--embeddings", "--pooling", "cls"])}
    times: dict = {name: [] for name in servers}
    try:
        http_load(servers["fastpar serve"].url[:-3], items[:args.clients], args.clients)  # warm-up, not counted
        http_load(servers["llama-server"].url[:-3], items[:args.clients], args.clients)
        names = list(servers)
        for rep in range(args.reps):
            for name in names[rep % 2:] + names[:rep % 2]:
                times[name].append(http_load(servers[name].url[:-3], items, args.clients))
            print(f"rep {rep}: " + ", ".join(f"{k} {v[-1]:.1f} s" for k, v in times.items()), flush=True)
    finally:
        for server in servers.values():
            server.close()
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--texts", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--n-parallel", type=int, default=64)
    ap.add_argument("--n-batch", type=int, default=2048)
    ap.add_argument("--gpu", action="store_true")
    ap.add_argument("--peers", action="store_true",
                    help="also llama-cpp-python (CPU) or sentence-transformers (--gpu)")
    ap.add_argument("--http", action="store_true", help="fastpar serve against llama-server instead")
    ap.add_argument("--clients", type=int, default=32, help="with --http: concurrent clients")
    ap.add_argument("--only", default=None,
                    help="comma-separated starts of the settings' names to run (more repetitions in the same time)")
    args = ap.parse_args()
    model = model_path()
    items = texts(args.texts)
    if args.http:
        times = run_http(args, model, items)
        rate = {k: args.texts / statistics.median(v) for k, v in times.items()}
        for k, v in rate.items():
            print(f"{k:28s} {v:8.1f} texts/s  fastpar x {rate['fastpar serve'] / v:.2f}")
        print(json.dumps({"texts": args.texts, "reps": args.reps, "clients": args.clients,
                          "n_parallel": args.n_parallel, "gpu": args.gpu, "texts_per_s": rate, "seconds": times}))
        return
    with tempfile.TemporaryDirectory() as tmp:
        file = os.path.join(tmp, "texts.txt")
        with open(file, "w") as f:
            f.write("\n".join(items))
        runs = {"fastpar": lambda: run_fastpar(args, model, file),
                "llama-embedding (defaults)": lambda: run_llama(args, model, file, "auto"),
                "llama-embedding (-fa off)": lambda: run_llama(args, model, file, "off")}
        if args.peers and args.gpu:
            runs["sentence-transformers (batch 32)"] = lambda: run_st(args, file, 32)
            runs["sentence-transformers (batch 256)"] = lambda: run_st(args, file, 256)
        elif args.peers:
            runs["llama-cpp-python (defaults)"] = lambda: run_llama_cpp_python(args, model, file, 0)
            runs[f"llama-cpp-python (n_batch {args.n_batch}, flash_attn)"] = lambda: run_llama_cpp_python(args, model, file,
                                                                                               args.n_batch)
        if args.only:
            runs = {k: v for k, v in runs.items() if k == "fastpar" or any(k.startswith(o) for o in args.only.split(","))}
        times = {name: [] for name in runs}
        inner = {name: [] for name in runs}
        names = list(runs)
        for rep in range(args.reps):
            # Each repetition starts one setting later, so that drift hits all alike.
            for name in names[rep % len(names):] + names[:rep % len(names)]:
                wall, in_call = runs[name]()
                times[name].append(wall)
                if in_call is not None:
                    inner[name].append(in_call)
            print(f"rep {rep}: " + ", ".join(f"{k} {v[-1]:.1f} s" for k, v in times.items()), flush=True)
    rate = {k: args.texts / statistics.median(v) for k, v in times.items()}
    in_rate = {k: args.texts / statistics.median(v) for k, v in inner.items() if v}
    for k, v in rate.items():
        extra = (f"   in-call {in_rate[k]:8.1f} texts/s  fastpar x {in_rate['fastpar'] / in_rate[k]:.2f}"
                 if k in in_rate else "")
        print(f"{k:36s} {v:8.1f} texts/s  fastpar x {rate['fastpar'] / v:.2f}{extra}")
    print(json.dumps({"texts": args.texts, "reps": args.reps, "n_parallel": args.n_parallel, "n_batch": args.n_batch,
                      "gpu": args.gpu, "texts_per_s": rate, "in_call_texts_per_s": in_rate, "seconds": times,
                      "in_call_seconds": inner}))


if __name__ == "__main__":
    main()
