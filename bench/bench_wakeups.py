#!/usr/bin/env python3
"""How an event loop is woken costs the engine's step: a Python listener per request
against `on_update(..., loop=)` (a pipe the loop watches) and no callback at all.

U asyncio streams on one Engine (U slots, one decoding thread), each request 50 new tokens
with ignore_eos, 6 requests a stream, and --work-us of pure-Python work in the loop per
piece (what an HTTP server does per event: encode, send). Modes, interleaved, fresh engine
each run, generated tokens/s of the whole load, medians of --reps:
- listener: `on_update(lambda: loop.call_soon_threadsafe(event.set))`, run on the engine's
  thread, which takes the GIL after every piece;
- loop: `on_update(event.set, loop=loop)`, the engine's thread writes to a pipe;
- poll: no callback; one coroutine wakes every stream each 0.5 ms (the floor: the engine's
  thread never touches Python, at the price of polling).
The model is tiny (2 layers, 64 wide, a 32,000-token vocabulary, made here with the gguf
package) so that a step takes milliseconds on a CPU, as a large model's does on a GPU.

    python bench/bench_wakeups.py [--users 64] [--work-us 0 50] [--reps 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import statistics
import time

import numpy as np

import fastpar
from fastpar._fetch import cache_dir
from make_speed_model import add_blocks

ROOT = pathlib.Path(__file__).resolve().parent.parent
VOCAB = ROOT / "vendor" / "llama.cpp" / "models" / "ggml-vocab-llama-spm.gguf"
MODES = ("listener", "loop", "poll")


def tiny_model() -> pathlib.Path:
    import gguf

    path = cache_dir() / "speed-models" / "tiny-llama-spm-f32.gguf"
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    vocab = gguf.GGUFReader(str(VOCAB))
    tokens = vocab.fields["tokenizer.ggml.tokens"].contents()
    e, n_head, n_head_kv, head_dim, ff, n_layer = 64, 4, 2, 16, 128, 2
    partial = path.with_suffix(".partial")
    w = gguf.GGUFWriter(str(partial), "llama")
    w.add_name("fastpar tiny wake-up bench model (random weights)")
    w.add_context_length(4096)
    w.add_embedding_length(e)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model(vocab.fields["tokenizer.ggml.model"].contents())
    w.add_token_list(tokens)
    w.add_token_scores(vocab.fields["tokenizer.ggml.scores"].contents())
    w.add_token_types(vocab.fields["tokenizer.ggml.token_type"].contents())
    w.add_bos_token_id(vocab.fields["tokenizer.ggml.bos_token_id"].contents())
    w.add_eos_token_id(vocab.fields["tokenizer.ggml.eos_token_id"].contents())
    rng = np.random.default_rng(0)

    def t(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape, dtype=np.float32) * 0.02

    w.add_tensor("token_embd.weight", t(len(tokens), e))
    w.add_tensor("output_norm.weight", np.ones(e, np.float32))
    w.add_tensor("output.weight", t(len(tokens), e))
    add_blocks(w, n_layer, e, n_head * head_dim, n_head_kv * head_dim, ff, t, lambda n: np.ones(n, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    partial.rename(path)
    return path


def busy(us: float) -> None:
    """`us` microseconds of pure-Python work, as encoding and sending an event is."""
    end = time.perf_counter() + us * 1e-6
    event = {"id": "cmpl-0", "choices": [{"index": 0, "delta": {"content": "piece"}, "finish_reason": None}]}
    while time.perf_counter() < end:
        json.dumps(event)


async def load(engine: fastpar.Engine, mode: str, users: int, work_us: float) -> float:
    loop = asyncio.get_running_loop()
    queue = list(range(users * 6))
    gen = [0]
    live: dict = {}

    async def poller() -> None:
        while True:
            await asyncio.sleep(0.0005)
            for event in list(live.values()):
                event.set()

    async def user() -> None:
        while queue:
            k = queue.pop()
            r = engine.submit(f"Tell me a story about the number {k}.", max_tokens=50, temperature=0.0,
                              ignore_eos=True)
            news = asyncio.Event()
            if mode == "listener":
                r.on_update(lambda: loop.call_soon_threadsafe(news.set))
            elif mode == "loop":
                r.on_update(news.set, loop=loop)
            else:
                live[k] = news
            while True:
                await news.wait()
                news.clear()
                finished = r.done()
                for _ in r.take_pieces():
                    busy(work_us)
                if finished:
                    break
            live.pop(k, None)
            gen[0] += r.result(0).n_gen_tokens

    polling = asyncio.ensure_future(poller()) if mode == "poll" else None
    t0 = time.perf_counter()
    await asyncio.gather(*(user() for _ in range(users)))
    wall = time.perf_counter() - t0
    if polling:
        polling.cancel()
    return gen[0] / wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=64)
    parser.add_argument("--work-us", type=float, nargs="+", default=[0.0, 50.0])
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    model = fastpar.Model(str(tiny_model()))
    print(f"{args.users} streams, 1 decoding thread, tok/s medians of {args.reps} (each run: one value)")
    print("| work per piece | " + " | ".join(MODES) + " | listener / poll | loop / poll |")
    print("|---" * (len(MODES) + 3) + "|")
    for work in args.work_us:
        runs: dict = {m: [] for m in MODES}
        for _ in range(args.reps):
            for mode in MODES:
                with fastpar.Engine(model, n_parallel=args.users, n_ctx_per_seq=128, n_threads=1,
                                    prefix_cache_mib=0) as engine:
                    runs[mode].append(asyncio.run(load(engine, mode, args.users, work)))
        med = {m: statistics.median(v) for m, v in runs.items()}
        print(f"| {work:g} µs | " + " | ".join(f"{med[m]:,.0f} ({', '.join(f'{x:,.0f}' for x in runs[m])})"
                                          for m in MODES)
              + f" | {med['listener'] / med['poll']:.2f} | {med['loop'] / med['poll']:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
