#!/usr/bin/env python3
"""Soak: 2,000 short requests through one Engine from 8 threads (not a test).

Reports throughput and the process's resident memory after request 200 and after
request 2,000 (the growth should stay under 5%), and writes bench/results/<host>-engine-soak.json (--out to choose).

    python bench/soak_engine.py [--requests 2000] [--threads 8]
"""

from __future__ import annotations

import argparse
import os
import json
import pathlib
import platform
import threading
import time

import fastpar

PROMPTS = [
    "The capital of France is", "Water boils at", "The quick brown fox", "My favourite colour is",
    "Two plus two equals", "The sun rises in the", "A cat is a", "Rain falls from",
]


def rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    model = fastpar.Model(fastpar.default_model_path())
    marks = {}
    done = 0
    lock = threading.Lock()
    counter = iter(range(args.requests))
    errors = []

    with fastpar.Engine(model, n_parallel=8, n_ctx_per_seq=256) as engine:
        def client():
            nonlocal done
            while True:
                with lock:
                    i = next(counter, None)
                if i is None:
                    return
                c = engine.submit(PROMPTS[i % len(PROMPTS)], max_tokens=args.max_tokens, temperature=0.8,
                                  seed=i).result()
                with lock:
                    if c.finish_reason not in ("stop", "length"):
                        errors.append(c.error)
                    done += 1
                    if done in (200, args.requests):
                        marks[done] = rss_kib()

        start = time.perf_counter()
        threads = [threading.Thread(target=client) for _ in range(args.threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - start
        stats = engine.stats()
        kv_clean = engine.kv_seq_pos_max() == [-1] * 8

    growth = (marks[args.requests] - marks[200]) / marks[200]
    result = {
        "requests": args.requests, "threads": args.threads, "max_tokens": args.max_tokens,
        "elapsed_s": elapsed, "requests_per_s": args.requests / elapsed,
        "gen_tokens": stats.n_gen_tokens, "prompt_tokens": stats.n_prompt_tokens,
        "total_tokens_per_s": (stats.n_gen_tokens + stats.n_prompt_tokens) / elapsed,
        "rss_kib_at_200": marks[200], f"rss_kib_at_{args.requests}": marks[args.requests],
        "rss_growth": growth, "failed": len(errors), "kv_clean_after": kv_clean,
        "command": f"python bench/soak_engine.py --requests {args.requests} --threads {args.threads}",
    }
    print(json.dumps(result, indent=2))
    out = pathlib.Path(args.out) if args.out else (
        pathlib.Path(__file__).parent / "results" / f"cpu-{platform.machine()}-{os.cpu_count()}core-engine-soak.json")
    out.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if not errors and kv_clean and growth < 0.05 else 1


if __name__ == "__main__":
    raise SystemExit(main())
