#!/usr/bin/env python3
"""A high-priority request's time to first token on a full `fastpar serve` against an idle one.

The server runs at its defaults with --n-parallel slots. Idle: one streamed completion
("priority": -1, 4 tokens) on the idle server, time to its first streamed token. Full: the
slots generate long answers (ignore_eos) and 64 more such requests wait for a slot, all of
priority 0, when the same urgent request comes; it preempts a running request, which goes
on after it. The difference is counted in steps of the full server: the median gap between
two streamed tokens of a running request (each step gives every running request one token).
Bar (issue 45): within 2 steps. (With priority 0 it would wait behind all 64, and without
preemption for the first running request to end.) Each figure is the median of --reps
rounds; the full rounds and the idle ones take turns.

    python bench/bench_priority.py [--reps 5] [--n-parallel 8] [--gpu]

Needs `pip install 'fastpar[server]'` (httpx comes with it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time

import httpx

import fastpar
from run import free_port

URGENT = "Write the word yes:"
LOAD = "Tell me a long story about a lighthouse keeper and the sea."


async def first_token(client: httpx.AsyncClient, priority: int) -> float:
    """Seconds from sending the urgent request to its first streamed token."""
    body = {"model": "m", "prompt": URGENT, "max_tokens": 4, "temperature": 0, "ignore_eos": True,
            "stream": True, "priority": priority}
    t0 = time.perf_counter()
    async with client.stream("POST", "/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]" and json.loads(line[6:])["choices"][0]["text"]:
                return time.perf_counter() - t0
    raise RuntimeError("no token came")


async def load_stream(client: httpx.AsyncClient, gaps: list, started: asyncio.Event, stop: asyncio.Event) -> None:
    """One long low-priority request: the gaps between its streamed tokens go to `gaps`."""
    body = {"model": "m", "prompt": LOAD, "max_tokens": 2000, "temperature": 0.8, "ignore_eos": True,
            "stream": True}
    try:
        await _load_stream(client, body, gaps, started, stop)
    except httpx.HTTPError:
        if not stop.is_set():
            raise


async def _load_stream(client, body, gaps, started, stop) -> None:
    async with client.stream("POST", "/v1/completions", json=body) as r:
        last = None
        async for line in r.aiter_lines():
            if stop.is_set():
                return  # leaving the stream cancels the request
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            now = time.perf_counter()
            if last is not None:
                gaps.append(now - last)
            last = now
            started.set()


async def full_round(url: str, n_parallel: int, n_waiting: int) -> tuple:
    limits = httpx.Limits(max_connections=n_parallel + n_waiting + 8)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        gaps: list = []
        stop = asyncio.Event()
        events = [asyncio.Event() for _ in range(n_parallel + n_waiting)]
        tasks = [asyncio.create_task(load_stream(client, gaps, ev, stop)) for ev in events]
        deadline = time.monotonic() + 300
        while sum(ev.is_set() for ev in events) < n_parallel:  # whichever got the slots
            if time.monotonic() > deadline:
                raise RuntimeError("the load did not start")
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.5)  # every slot generating, the others queued
        health = (await client.get("/health")).json()
        n_gaps = len(gaps)
        ttft = await first_token(client, -1)
        step = statistics.median(gaps[:n_gaps])
        stop.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return ttft, step, health


async def idle_round(url: str) -> float:
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        return await first_token(client, -1)


def wait_idle(url: str) -> None:
    """Until the cancelled load has left the server (it notices the closed streams)."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        h = httpx.get(url + "/health", timeout=10).json()
        if h.get("slots_busy") == 0 and h.get("queue_depth") == 0:
            return
        time.sleep(0.2)
    raise RuntimeError(f"the server is still busy: {h}")


def wait_ready(url: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError("the server did not start")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--n-parallel", type=int, default=8)
    ap.add_argument("--waiting", type=int, default=64)
    ap.add_argument("--gpu", action="store_true", help="every layer on the GPU")
    ap.add_argument("--model", default=None, help="GGUF (default: the default model)")
    args = ap.parse_args()

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "fastpar", "serve", args.model or fastpar.default_model_path(), "--port", str(port),
           "--n-parallel", str(args.n_parallel), "--log-level", "warning"]
    if args.gpu:
        cmd += ["--n-gpu-layers", "-1"]
    proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        wait_ready(url, proc)
        asyncio.run(idle_round(url))  # warm-up
        idle, full, steps = [], [], []
        for rep in range(args.reps):
            idle.append(asyncio.run(idle_round(url)))
            ttft, step, health = asyncio.run(full_round(url, args.n_parallel, args.waiting))
            full.append(ttft)
            steps.append(step)
            wait_idle(url)
            print(f"round {rep}: idle {idle[-1] * 1e3:.1f} ms, full {ttft * 1e3:.1f} ms, step {step * 1e3:.1f} ms, "
                  f"health {health}", flush=True)
    finally:
        proc.terminate()
        proc.wait(60)
    step = statistics.median(steps)
    gap = (statistics.median(full) - statistics.median(idle)) / step
    print(json.dumps({"slots": args.n_parallel, "waiting": args.waiting, "reps": args.reps,
                      "idle_ttft_ms": round(statistics.median(idle) * 1e3, 1),
                      "full_ttft_ms": round(statistics.median(full) * 1e3, 1),
                      "step_ms": round(step * 1e3, 1), "extra_steps": round(gap, 2),
                      "bar_steps": 2,
                      "met": gap <= 2}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
