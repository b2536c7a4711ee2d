"""Scoring speed: perplexity against llama-perplexity, and a multiple-choice task through
lm-evaluation-harness (fastpar.lm_eval.FastparLM, prefix sharing on and off), through
fastpar.loglikelihood directly, through llama.cpp's own 4-choice scorer (llama-perplexity
--hellaswag on the same questions) and lm-eval's `local-completions` model against
llama-server, on one machine, in one run.

    python bench/bench_scoring.py --out bench/results/cpu-x86_64-2core-scoring.md
    python bench/bench_scoring.py --gpu --model speed.gguf --out ...   # CUDA build, every layer on the GPU

The perplexity text is the pinned llama.cpp's own Markdown (every .md file of
vendor/llama.cpp in sorted order, concatenated until the text holds --min-tokens tokens):
real prose and code, the same bytes wherever the vendored copy is the pinned one. The
multiple-choice task is generated: --questions arithmetic questions behind one shared
instruction, four numeric choices each, seeded.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import re
import subprocess
import sys
import tempfile
import time

import fastpar

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "tests"))
from llama_tools import llama_tool  # noqa: E402


def ppl_text(model: fastpar.Model, min_tokens: int) -> tuple:
    parts, n = [], 0
    for f in sorted((ROOT / "vendor" / "llama.cpp").rglob("*.md")):
        t = f.read_text(encoding="utf-8", errors="replace")
        parts.append(t)
        n += len(model._model.tokenize(t, False, False))
        if n >= min_tokens:
            break
    text = "\n\n".join(parts)
    if n < min_tokens:
        raise SystemExit(f"the vendored Markdown holds {n} tokens, fewer than --min-tokens {min_tokens}")
    return text, len(model._model.tokenize(text, False, True)), len(parts)


def run_llama_perplexity(model_path: str, text_file: str, n_ctx: int, threads: int, ngl: int) -> dict:
    t0 = time.perf_counter()
    out = subprocess.run([llama_tool("llama-perplexity"), "-m", model_path, "-f", text_file, "-c", str(n_ctx),
                          "-t", str(threads), "-ngl", str(ngl)], capture_output=True, text=True, check=True)
    wall = time.perf_counter() - t0
    log = out.stdout + out.stderr
    return {"ppl": float(re.search(r"Final estimate: PPL = ([0-9.]+)", log).group(1)), "s": wall}


INSTRUCTION = ("The following are questions about arithmetic. Each one has one right answer among four "
               "numbers.")


def mc_context(a: int, b: int) -> str:
    # One line: llama-perplexity's task file is line-based.
    return f"{INSTRUCTION} Question: What is {a} plus {b}? Answer:"


def mc_task(folder: pathlib.Path, n: int) -> str:
    """The task as lm-eval YAML + JSONL, as (context, continuations, gold) tuples in
    folder/mc.json, and in llama-perplexity's --hellaswag layout (6 lines a question:
    context, gold index, 4 endings) in folder/mc.hellaswag.txt. Both join context and
    continuation with one space."""
    rng = random.Random(1234)
    docs = []
    for _ in range(n):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        right = a + b
        wrong = rng.sample([v for v in range(right - 15, right + 16) if v != right], 3)
        choices = wrong + [right]
        rng.shuffle(choices)
        docs.append({"a": a, "b": b, "choices": [str(c) for c in choices], "answer": choices.index(right)})
    (folder / "mc.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (folder / "mc.hellaswag.txt").write_text("".join(
        f"{mc_context(d['a'], d['b'])}\n{d['answer']}\n" + "".join(c + "\n" for c in d["choices"]) for d in docs))
    (folder / "mc.json").write_text(json.dumps(
        [[mc_context(d["a"], d["b"]), [" " + c for c in d["choices"]], d["answer"]] for d in docs]))
    (folder / "bench_mc.yaml").write_text(f"""task: bench_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {folder / 'mc.jsonl'}
test_split: test
output_type: multiple_choice
doc_to_text: "{INSTRUCTION} Question: What is {{{{a}}}} plus {{{{b}}}}? Answer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
""")
    return str(folder)


def run_fastparlm(model: fastpar.Model, folder: str, threads: int, share: bool, n_parallel: int) -> dict:
    import lm_eval
    from lm_eval.tasks import TaskManager

    import fastpar.lm_eval as fl

    ctx = fastpar.Context(model, n_parallel=n_parallel, n_ctx_per_seq=256, n_threads=threads, share_prefixes=share)
    lm = fl.FastparLM(ctx)
    t0 = time.perf_counter()
    out = lm_eval.simple_evaluate(model=lm, tasks=["bench_mc"], task_manager=TaskManager(include_path=folder),
                                  bootstrap_iters=0, verbosity="ERROR")
    return {"wall_s": time.perf_counter() - t0, "acc": out["results"]["bench_mc"]["acc,none"]}


def run_direct(model: fastpar.Model, folder: str, threads: int, n_parallel: int) -> dict:
    """The same pairs through fastpar.loglikelihood, without lm-eval around it."""
    tasks = json.loads((pathlib.Path(folder) / "mc.json").read_text())
    pairs = [(ctx_text, cont) for ctx_text, conts, _ in tasks for cont in conts]
    t0 = time.perf_counter()
    ctx = fastpar.Context(model, n_parallel=n_parallel, n_ctx_per_seq=256, n_threads=threads)
    scores = fastpar.loglikelihood(ctx, pairs)
    wall = time.perf_counter() - t0
    right, k = 0, 0
    for _, conts, gold in tasks:
        right += max(range(len(conts)), key=lambda j, k=k: scores[k + j].logprob) == gold
        k += len(conts)
    return {"wall_s": wall, "acc": right / len(tasks)}


def run_llama_mc(model_path: str, folder: str, threads: int, ngl: int, n_questions: int) -> dict:
    """llama.cpp's own multiple-choice scorer on the same questions: llama-perplexity
    --hellaswag (32 questions a batch, each context decoded once for its 4 endings; it
    reports acc_norm, the log-likelihood per ending token). Its best settings here: 128
    sequences of 256 positions, a 2048-token batch. Process wall time, model load included."""
    t0 = time.perf_counter()
    out = subprocess.run([llama_tool("llama-perplexity"), "-m", model_path, "-f", str(pathlib.Path(folder) / "mc.hellaswag.txt"),
                          "--hellaswag", "--hellaswag-tasks", str(n_questions), "-np", "128", "-c", "256", "-b", "2048",
                          "-t", str(threads), "-ngl", str(ngl)], capture_output=True, text=True, check=True)
    wall = time.perf_counter() - t0
    rows = re.findall(rf"^{n_questions}\t([0-9.]+)", out.stdout + out.stderr, re.M)
    return {"wall_s": wall, "acc_norm": float(rows[-1]) / 100 if rows else float("nan")}


def run_server(model_path: str, folder: str, threads: int, ngl: int, n_parallel: int) -> dict:
    """lm-eval's local-completions model against llama-server at its best settings for
    many requests (continuous batching over n_parallel slots, prompt cache on)."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    port = 18432
    server = subprocess.Popen([llama_tool("llama-server"), "-m", model_path, "-t", str(threads), "-ngl", str(ngl),
                               "--port", str(port), "-np", str(n_parallel), "-c", str(256 * n_parallel), "-cb"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        import urllib.request

        for _ in range(600):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except Exception:
                time.sleep(0.5)
        t0 = time.perf_counter()
        try:
            out = lm_eval.simple_evaluate(
                model="local-completions", tasks=["bench_mc"], task_manager=TaskManager(include_path=folder),
                model_args=f"base_url=http://127.0.0.1:{port}/v1/completions,num_concurrent={n_parallel},"
                           "tokenized_requests=False,tokenizer_backend=None,max_retries=1",
                bootstrap_iters=0, verbosity="ERROR")
            return {"wall_s": time.perf_counter() - t0, "acc": out["results"]["bench_mc"]["acc,none"]}
        except Exception as e:  # noqa: BLE001 - the message is the result
            return {"wall_s": time.perf_counter() - t0, "error": f"{type(e).__name__}: {str(e)[:300]}"}
    finally:
        server.terminate()
        server.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="GGUF (default: fastpar's default model)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--n-ctx", type=int, default=512)
    ap.add_argument("--min-tokens", type=int, default=100_000)
    ap.add_argument("--questions", type=int, default=500)
    ap.add_argument("--n-parallel", type=int, default=16)
    ap.add_argument("--gpu", action="store_true", help="every layer on the GPU (a CUDA build)")
    ap.add_argument("--skip", default="", help="comma-separated stages to skip: ppl,mc,llama,server")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    ngl = -1 if args.gpu else 0
    model_path = args.model or fastpar.default_model_path()
    model = fastpar.Model(model_path, n_gpu_layers=ngl)
    rows, notes = [], []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        if "ppl" not in skip:
            text, n_tokens, n_files = ppl_text(model, args.min_tokens)
            (tmp / "text.txt").write_text(text, encoding="utf-8")
            # Both sides timed from loading the model to the result (llama-perplexity's
            # process wall time), so that loading and tokenizing count on both.
            t0 = time.perf_counter()
            ctx = fastpar.Context(fastpar.Model(model_path, n_gpu_layers=ngl), n_parallel=8, n_ctx_per_seq=args.n_ctx,
                                  n_threads=args.threads)
            ours = fastpar.perplexity(ctx, text, n_ctx=args.n_ctx)
            t_ours = time.perf_counter() - t0
            base = run_llama_perplexity(model_path, str(tmp / "text.txt"), args.n_ctx, args.threads, ngl)
            n_eval = ours.n_chunks * args.n_ctx
            rows.append(("perplexity, fastpar.perplexity (model load included on both)", f"{t_ours:.1f} s", f"{n_eval / t_ours:.0f} tok/s",
                         f"PPL {ours.perplexity:.4f} +/- {ours.std_error:.5f}"))
            rows.append(("perplexity, llama-perplexity (same threads)", f"{base['s']:.1f} s",
                         f"{n_eval / base['s']:.0f} tok/s", f"PPL {base['ppl']:.4f}"))
            notes.append(f"perplexity text: {n_files} Markdown files of vendor/llama.cpp, {n_tokens} tokens, "
                         f"{ours.n_chunks} chunks of n_ctx={args.n_ctx}; fastpar/llama-perplexity tokens/s ratio "
                         f"{base['s'] / t_ours:.2f}x")
        if not {"mc", "llama", "server"} <= skip:
            folder = mc_task(tmp, args.questions)
        if "mc" not in skip:
            on = run_fastparlm(model, folder, args.threads, True, args.n_parallel)
            off = run_fastparlm(model, folder, args.threads, False, args.n_parallel)
            rows.append((f"{args.questions} x 4-choice task, FastparLM", f"{on['wall_s']:.1f} s", "", f"acc {on['acc']:.3f}"))
            rows.append((f"{args.questions} x 4-choice task, FastparLM, share_prefixes=False", f"{off['wall_s']:.1f} s",
                         "", f"acc {off['acc']:.3f}"))
            direct = run_direct(model, folder, args.threads, args.n_parallel)
            rows.append((f"{args.questions} x 4-choice task, fastpar.loglikelihood (no lm-eval)",
                         f"{direct['wall_s']:.1f} s", "", f"acc {direct['acc']:.3f}"))
        if "llama" not in skip:
            raw = run_llama_mc(model_path, folder, args.threads, ngl, args.questions)
            rows.append((f"{args.questions} x 4-choice task, llama-perplexity --hellaswag (model load included)",
                         f"{raw['wall_s']:.1f} s", "", f"acc_norm {raw['acc_norm']:.3f}"))
        if "server" not in skip:
            srv = run_server(model_path, folder, args.threads, ngl, args.n_parallel)
            rows.append((f"{args.questions} x 4-choice task, lm-eval local-completions + llama-server",
                         f"{srv['wall_s']:.1f} s", "", srv.get("error") or f"acc {srv['acc']:.3f}"))
    if "server" not in skip:
        notes.append("lm-eval's API models (local-completions, gguf) score a continuation by sending context and "
                     "continuation with `echo: true` and reading the prompt's log-probabilities, and need a "
                     "Hugging Face tokenizer to find where the continuation starts; the vendored llama-server "
                     "refuses `echo` (\"Only no echo is supported\"), so that row records the error it met first")
    lines = ["| what | wall | rate | result |", "|---|---|---|---|"]
    lines += [f"| {' | '.join(r)} |" for r in rows]
    report = "\n".join(lines + [""] + [f"* {n}" for n in notes])
    print(report)
    if args.out:
        header = (f"# Scoring: perplexity and a multiple-choice task\n\n`python bench/bench_scoring.py "
                  f"{' '.join(sys.argv[1:])}`\n\nmodel: {os.path.basename(model_path)} ({model.description}), "
                  f"backend {fastpar.backend()}, {args.threads} threads\n\n")
        pathlib.Path(args.out).write_text(header + report + "\n")


if __name__ == "__main__":
    main()
