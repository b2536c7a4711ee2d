#!/usr/bin/env python3
"""The CPU time `fastpar serve`'s event loop spends per streamed token, by HTTP stack.

Every stream of a server shares its one event loop, so the loop's time per event caps the
tokens a second the server can stream, whatever the engine makes (a GPU's rates reach that
cap first). This bench runs `fastpar serve` on a tiny model (bench_wakeups.py's: a step takes
milliseconds on a CPU), streams 64 users x 8 requests x 50 tokens to it from one client
process (httpx, completions with ignore_eos), and reads the loop thread's CPU time from
/proc over that load, for uvicorn with asyncio and h11 and with uvloop and httptools (what
uvicorn takes when they are importable; fastpar[server] installs them), the latter also with
--stream-interval 4 (events of 4 tokens). The tokens/s column is the whole machine's: server,
client and engine share its cores. Interleaved, fresh server each run, medians of --reps;
Linux only (/proc).

    python bench/bench_server_loop.py [--reps 3] [--users 64]
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from bench_wakeups import tiny_model  # noqa: E402
from run import free_port, thread_cpu_s, wait_healthy  # noqa: E402

STACKS = {"asyncio + h11": ("asyncio", "h11", 1), "uvloop + httptools": ("uvloop", "httptools", 1),
          "uvloop + httptools, --stream-interval 4": ("uvloop", "httptools", 4)}

SERVER = """
import sys, uvicorn
from fastpar.server import service
loop, http = sys.argv[3], sys.argv[4]
init = uvicorn.Config.__init__
def with_stack(self, *a, **k):
    k.update(loop=loop, http=http)
    init(self, *a, **k)
uvicorn.Config.__init__ = with_stack
service.serve(sys.argv[1], port=int(sys.argv[2]), n_parallel=int(sys.argv[5]), n_ctx_per_seq=128, n_threads=1,
              prefix_cache_mib=0, stream_interval=int(sys.argv[6]), log_level="warning")
"""

CLIENT = """
import asyncio, sys, time, httpx
port, users, per = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
async def main():
    limits = httpx.Limits(max_connections=users + 8, max_keepalive_connections=users + 8)
    async with httpx.AsyncClient(timeout=600, limits=limits) as c:
        async def user(u):
            n = 0
            for k in range(per):
                body = {"model": "m", "prompt": f"Tell me a story about the number {u * 100 + k}.",
                        "max_tokens": 50, "temperature": 0, "stream": True, "ignore_eos": True}
                async with c.stream("POST", f"http://127.0.0.1:{port}/v1/completions", json=body) as r:
                    async for line in r.aiter_lines():
                        n += line.startswith("data: {")
            return n
        t0 = time.perf_counter()
        events = sum(await asyncio.gather(*(user(u) for u in range(users))))
        print(users * per * 50 / (time.perf_counter() - t0), events)
asyncio.run(main())
"""


def one_run(model: str, loop: str, http: str, interval: int, users: int) -> tuple:
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", SERVER, model, str(port), loop, http, str(users), str(interval)])
    try:
        wait_healthy(port, server, f"fastpar serve ({loop}, {http})", 120)
        client = [sys.executable, "-c", CLIENT, str(port), str(users)]
        subprocess.run(client + ["2"], check=True, capture_output=True)  # warm: connections, first steps
        before = thread_cpu_s(server.pid, server.pid)  # its main thread runs the event loop
        out = subprocess.run(client + ["8"], check=True, capture_output=True, text=True).stdout.split()
        cpu = thread_cpu_s(server.pid, server.pid) - before
        tokens = users * 8 * 50
        return cpu / tokens * 1e6, float(out[0]), int(out[1])
    finally:
        server.terminate()
        server.wait(60)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--users", type=int, default=64)
    args = parser.parse_args()
    model = str(tiny_model())
    runs: dict = {name: [] for name in STACKS}
    for _ in range(args.reps):
        for name, (loop, http, interval) in STACKS.items():
            runs[name].append(one_run(model, loop, http, interval, args.users))
    base = statistics.median(r[0] for r in runs["asyncio + h11"])
    print(f"{args.users} users x 8 requests x 50 tokens, streamed; medians of {args.reps}")
    print("| stack | loop CPU µs per token | x asyncio + h11 | tokens/s | events per request | runs (µs) |")
    print("|---|---:|---:|---:|---:|---|")
    for name, rs in runs.items():
        us = statistics.median(r[0] for r in rs)
        print(f"| {name} | {us:.1f} | {us / base:.2f} | {statistics.median(r[1] for r in rs):,.0f} | "
              f"{statistics.median(r[2] for r in rs) / (args.users * 8):.1f} | {', '.join(f'{r[0]:.1f}' for r in rs)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
