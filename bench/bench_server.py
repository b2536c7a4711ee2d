#!/usr/bin/env python3
"""`fastpar serve` against llama-server, through the same client and load, and the Engine
in-process on that load (what HTTP costs).

N users, each with the async `openai` client (`--client raw`: the same requests over asyncio's
own connections, JSON read only for the usage, far lighter on the cores), send their next
request as soon as the last one ends (streamed, so that time to first token is measured;
every request asks for its tokens with ignore_eos). The users are spread over several client processes when there are
many (--client-procs): one Python process parsing every stream would limit the load itself.
Both servers run the same model with the same slots; llama-server (built from
vendor/llama.cpp, bench/run.py build_baselines) is tried with each setting in
LLAMA_SERVER_SETTINGS and its fastest is the baseline ("default": its defaults, the prompt
cache on; "no-prompt-cache" sends cache_prompt false with each request, the setting of the
tables before 2026-12-07). fastpar serve runs at its defaults
(its prefix cache on, as llama-server's prompt cache is) and with --prefix-cache-mib 0;
the in-process Engine has the server's default cache. Each measurement is the median of
--reps repetitions, the servers taking turns within a repetition.

Workloads (CPU): W1 the speed model (Qwen3-0.6B shape, Q4_K_M), 8 users, 32-token prompts,
50 new tokens; W4 the default model, 400 requests of 64 tokens, 4 new; chat the default
model, chat messages of mixed lengths (16-400 tokens) and answers (8-96 tokens), 8 users.
--gpu: every layer on the GPU, the speed model with 64 and 256 users (as many slots, or --slots), and
with --workloads mixed also 256 users whose answers are 10-90 tokens long (mean 50).

While a load runs, a thread of the bench GETs each server's /health every 50 ms (a new
connection each time, as a load balancer's probe): its latency, p50 and p99, is how long
a probe waits while every slot generates (fastpar's /health never waits on generation; a
unit test holds that property, these are its figures).

The workloads of one prompt length and one answer length also get a ceiling: raw llama.cpp
(llama-batched-bench, same build, model, threads and slots) decoding one lockstep wave of
that shape, with no requests arriving, no HTTP and no tokenizing: what a server built on
llama.cpp's decode can approach, not pass.

    python bench/bench_server.py                 # CPU -> bench/results/cpu-<arch>-<n>core-server.md
    python bench/bench_server.py --gpu           # GPU -> bench/results/gpu-<name>-server.md
    python bench/bench_server.py --gpu --speed-type F16   # the F16 speed model

Needs `pip install 'fastpar[server]' openai` and a checkout (the baselines build from it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import pathlib
import platform
import random
import re
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse

import fastpar
from fastpar.server.protocol import SERVE_PREFIX_CACHE_MIB

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import run as bench_run  # noqa: E402  (build_baselines, make_prompts, Target, physical_batch, free_port, wait_healthy)

try:
    import openai
    import httpx
except ImportError as e:
    sys.exit(f"bench_server.py needs the openai client: pip install openai ({e})")

# llama-server settings tried, the fastest the baseline; name: (llama-server's arguments,
# fields each request adds). Its defaults keep each slot's prompt (cache_prompt, per request)
# and a prompt cache in host memory, which --cache-ram 0 turns off (every W1/W4 prompt is
# new); the no-prompt-cache settings send cache_prompt false, as the tables before
# 2026-12-07 did.
LLAMA_SERVER_SETTINGS = {"default": ([], {}), "cache-ram-0": (["--cache-ram", "0"], {}),
                         "no-prompt-cache": ([], {"cache_prompt": False}),
                         "cache-ram-0-no-prompt-cache": (["--cache-ram", "0"], {"cache_prompt": False})}
FASTPAR_CACHE_OFF = "fastpar serve --prefix-cache-mib 0"


class Proc:
    def __init__(self, name: str, cmd: list) -> None:
        self.name, self.port = name, bench_run.free_port()
        self.proc = subprocess.Popen(cmd + ["--port", str(self.port)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        bench_run.wait_healthy(self.port, self.proc, name)
        self.url = f"http://127.0.0.1:{self.port}/v1"

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def fastpar_server(model: str, n_par: int, n_ctx: int, threads: int, extra: list = ()) -> Proc:
    return Proc("fastpar serve", [sys.executable, "-m", "fastpar", "serve", model, "--host", "127.0.0.1",
                                  "--n-parallel", str(n_par), "--n-ctx-per-seq", str(n_ctx), "--n-threads",
                                  str(threads), "--n-gpu-layers", str(bench_run.Target.n_gpu_layers),
                                  "--max-queued", "100000", "--log-level", "warning", *extra])


def llama_server(binary: str, model: str, n_par: int, n_ctx: int, threads: int, extra: list) -> Proc:
    ub = bench_run.physical_batch(bench_run.Target.gpu)
    return Proc("llama-server", [binary, "-m", model, "-np", str(n_par), "-c", str(n_par * n_ctx), "-t", str(threads),
                                 "--host", "127.0.0.1", "-b", ub, "-ub", ub, "--no-webui",
                                 *(["-ngl", "999"] if bench_run.Target.gpu else []), *extra])


# ----------------------------------------------------------------------------- the load

def body_of(req: dict, fields: dict | None = None) -> dict:
    """One request, the same for both servers: greedy (top_k 1, llama-server's cheapest way
    to the most likely token), ignore_eos, the usage in the last chunk; `fields`: a server
    setting's own (LLAMA_SERVER_SETTINGS)."""
    b = dict(model="m", max_tokens=req["gen"], temperature=0.0, stream=True, stream_options={"include_usage": True},
             extra_body={"top_k": 1, "ignore_eos": True, **(fields or {})})
    if "messages" in req:
        b["messages"] = req["messages"]
    else:
        b["prompt"] = req["prompt"]
    return b


class HealthProbe:
    """GETs `base`/health every `interval` seconds on a thread of its own while in a `with`
    block; `latencies` in seconds (a failed probe counts as None)."""

    def __init__(self, base: str, interval: float = 0.05) -> None:
        self.base, self.interval = base, interval
        self.latencies: list = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=60, limits=httpx.Limits(max_keepalive_connections=0)) as client:
            while not self.stop.is_set():
                t0 = time.perf_counter()
                try:
                    ok = client.get(self.base + "/health").status_code == 200
                except httpx.HTTPError:
                    ok = False
                self.latencies.append(time.perf_counter() - t0 if ok else None)
                self.stop.wait(self.interval)

    def __enter__(self) -> "HealthProbe":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()


def async_client(url: str, users: int) -> "openai.AsyncOpenAI":
    """The async openai client of `users` concurrent users. A new connection for every
    request, to every server: llama-server (cpp-httplib) closes a kept-alive connection after
    a few requests, and a request sent on it just then fails (retrying it would put the
    client's back-off into the measurement)."""
    limits = httpx.Limits(max_connections=users + 8, max_keepalive_connections=0)
    return openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0, timeout=3600,
                              http_client=openai.DefaultAsyncHttpxClient(limits=limits))


async def stream(client: "openai.AsyncOpenAI", b: dict) -> dict:
    """Sends one streamed request (a body of body_of's shape) -> ttft (seconds from sending to
    the first text; to the end if none came), text, gen and prompt (its usage's tokens)."""
    t0 = time.perf_counter()
    first, pieces, gen, prompt = None, [], 0, 0
    if "messages" in b:
        chunks = await client.chat.completions.create(**b)
    else:
        chunks = await client.completions.create(**b)
    async for chunk in chunks:
        if chunk.choices:
            c = chunk.choices[0]
            text = c.delta.content if hasattr(c, "delta") else c.text
            if text:
                if first is None:
                    first = time.perf_counter() - t0
                pieces.append(text)
        if chunk.usage is not None:
            gen += chunk.usage.completion_tokens
            prompt += chunk.usage.prompt_tokens
    return dict(ttft=first if first is not None else time.perf_counter() - t0, text="".join(pieces), gen=gen,
                prompt=prompt)


class ServerError(RuntimeError):
    """A request the server answered with an error or dropped (raw_stream), or a client
    process that failed: a setting the server fails with is reported, not fatal."""


async def raw_stream(url: str, b: dict) -> dict:
    """stream()'s request and answer without the openai client: the body as the client
    would send it, over a connection of asyncio's own (one a request, as async_client's),
    reading the chunked SSE answer event by event and decoding JSON only for the usage.
    A few microseconds an event, where the openai client takes about what a server takes to
    send one: a load generator that leaves the machine's cores to the server."""
    body = {k: v for k, v in b.items() if k != "extra_body"} | b.get("extra_body", {})
    path = "/chat/completions" if "messages" in body else "/completions"
    parts = urllib.parse.urlsplit(url + path)
    payload = json.dumps(body).encode()
    t0 = time.perf_counter()
    try:
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    except OSError as err:
        raise ServerError(f"{url + path}: {err}") from err
    try:
        writer.write(f"POST {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json\r\n"
                     f"Authorization: Bearer x\r\nContent-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
                     .encode() + payload)
        status = await reader.readline()
        headers = {}
        while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
            k, _, v = line.decode("latin-1").partition(":")
            headers[k.strip().lower()] = v.strip().lower()
        if status.split()[1:2] != [b"200"]:
            raise ServerError(f"{url + path}: {status.decode('latin-1').strip()} {await reader.read(2000)!r}")
        first, gen, prompt, buf = None, 0, 0, b""
        chunked = headers.get("transfer-encoding") == "chunked"
        while True:
            if chunked:
                size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
                try:
                    data = (await reader.readexactly(size + 2))[:-2] if size else b""
                except asyncio.IncompleteReadError as err:
                    raise ServerError(f"{url + path}: the answer ended mid-chunk") from err
            else:
                data = await reader.read(1 << 16)
            if not data:
                break
            buf += data.replace(b"\r\n", b"\n")
            *events, buf = buf.split(b"\n\n")
            for ev in events:
                if not ev.startswith(b"data: ") or ev == b"data: [DONE]":
                    continue
                if first is None and re.search(rb'"(text|content)":"[^"]', ev):
                    first = time.perf_counter() - t0
                if b'"usage":{' in ev:
                    usage = json.loads(ev[6:])["usage"]
                    gen += usage["completion_tokens"]
                    prompt += usage["prompt_tokens"]
    finally:
        writer.close()
    return dict(ttft=first if first is not None else time.perf_counter() - t0, gen=gen, prompt=prompt)


async def _users(url: str, requests: list, users: int, client: str = "openai", fields: dict | None = None) -> dict:
    """`users` users of one client sending `requests`, each its next when its last ends;
    client "openai" (the openai package) or "raw" (raw_stream)."""
    async with async_client(url, users) as oa:
        queue = list(reversed(requests))
        ttfts, gen, prompt = [], [0], [0]

        async def user():
            while queue:
                b = body_of(queue.pop(), fields)
                r = await (stream(oa, b) if client == "openai" else raw_stream(url, b))
                gen[0] += r["gen"]
                prompt[0] += r["prompt"]
                ttfts.append(r["ttft"])

        await asyncio.gather(*(user() for _ in range(users)))
        return dict(gen=gen[0], prompt=prompt[0], ttfts=ttfts, end=time.monotonic())


def _client_process(url: str, requests: list, users: int, client: str, fields, ready, start, out) -> None:
    """One client process of http_load: its share of the users, started with the others. A
    failure goes back as {"error": ...}, so that the parent raises it rather than waits."""
    ready.put(True)
    start.wait()
    try:
        out.put(asyncio.run(_users(url, requests, users, client, fields)))
    except Exception as err:  # noqa: BLE001 - any failure ends this client's share of the load
        out.put({"error": f"{type(err).__name__}: {err}"})


def http_load(url: str, requests: list, users: int, procs: int, client: str = "openai",
              on_start=None, on_end=None, fields: dict | None = None) -> dict:
    """The users spread over `procs` client processes (their requests dealt round-robin),
    so that the client's own parsing of the streams is not what limits the load: the openai
    client takes about as much CPU a chunk as a server takes to send it (client "raw":
    raw_stream, far less). Timed from the start signal to the last process's last answer
    (time.monotonic is one clock for all); on_start() and on_end(), when given, are called
    at those two moments (a caller's measurement window, without the processes' start-up)."""
    on_start, on_end = on_start or (lambda: None), on_end or (lambda: None)
    if client not in ("openai", "raw"):
        raise ValueError(f"client must be 'openai' or 'raw', got {client!r}")
    with HealthProbe(url[:-len("/v1")]) as probe:
        if procs <= 1:
            on_start()
            t0 = time.monotonic()
            parts = [asyncio.run(_users(url, requests, users, client, fields))]
            on_end()
        else:
            mp = multiprocessing.get_context("spawn")
            ready, out, start = mp.Queue(), mp.Queue(), mp.Event()
            shares = [users // procs + (p < users % procs) for p in range(procs)]
            workers = [mp.Process(target=_client_process, daemon=True,
                                  args=(url, requests[p::procs], shares[p], client, fields, ready, start, out))
                       for p in range(procs)]
            for w in workers:
                w.start()
            for _ in workers:
                ready.get(timeout=120)  # every client has imported openai and is waiting
            on_start()
            t0 = time.monotonic()
            start.set()
            parts = [out.get(timeout=3600) for _ in workers]
            on_end()
            for w in workers:
                w.join()
            errors = [p["error"] for p in parts if "error" in p]
            if errors:
                raise ServerError(f"{len(errors)} of {procs} client processes failed: {errors[0]}")
    return dict(wall=max(p["end"] for p in parts) - t0, gen=sum(p["gen"] for p in parts),
                prompt=sum(p["prompt"] for p in parts), ttfts=[x for p in parts for x in p["ttfts"]],
                health=probe.latencies)


async def engine_load(engine: fastpar.Engine, requests: list, users: int) -> dict:
    queue = list(reversed(requests))
    ttfts, gen, prompt = [], [0], [0]

    async def user():
        while queue:
            req = queue.pop()
            t0 = time.perf_counter()
            first = None
            r = engine.submit(req.get("messages") or req["prompt"], max_tokens=req["gen"], temperature=0.0,
                              ignore_eos=True)
            wake = asyncio.Event()
            r.on_update(wake.set, loop=asyncio.get_running_loop())
            while True:
                await wake.wait()
                wake.clear()
                done = r.done()
                if first is None and r.take_pieces():
                    first = time.perf_counter() - t0
                if done:
                    break
            c = r.result(0)
            gen[0] += c.n_gen_tokens
            prompt[0] += c.n_prompt_tokens + c.n_prompt_tokens_shared
            ttfts.append(first if first is not None else time.perf_counter() - t0)

    t0 = time.perf_counter()
    await asyncio.gather(*(user() for _ in range(users)))
    return dict(wall=time.perf_counter() - t0, gen=gen[0], prompt=prompt[0], ttfts=ttfts)


def percentile(xs: list, q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def paired(runs: list, base: list) -> float:
    """The median over repetitions of runs[i] / base[i]. Each repetition runs every server
    back to back, so the ratio within one cancels the machine's drift between repetitions."""
    return statistics.median(x / b for x, b in zip(runs, base))


# ----------------------------------------------------------------------------- workloads

def workloads(names: list, default_model, speed: fastpar.Model, gpu: bool, reps: int) -> list:
    """(name, model path, users = slots, requests of each repetition, n_ctx_per_seq). Each
    repetition has prompts of its own (same shapes, other words): a server keeps its prefix
    cache across repetitions, and one-shot loads must not find their prompts in it."""
    def per_rep(model: fastpar.Model, n: int, n_tokens: int, gen: int) -> list:
        return [[dict(prompt=p, gen=gen) for p in bench_run.make_prompts(model, n, n_tokens, 0, seed=r)]
                for r in range(reps)]

    out = []
    if gpu:
        for users in (64, 256):
            out.append((f"G-np{users}", speed.path, users, per_rep(speed, users * 4, 32, 50), 32 + 50 + 8))
        if "mixed" in names:  # the same prompts, answers of 10-90 tokens (mean 50): slots refill apart
            runs = per_rep(speed, 256 * 4, 32, 50)
            for r, reqs in enumerate(runs):
                rng = random.Random(5 + 1000 * r)
                for req in reqs:
                    req["gen"] = rng.randint(10, 90)
            out.append(("G-mixed256", speed.path, 256, runs, 32 + 90 + 8))
        return out
    if "W1" in names:
        out.append(("W1", speed.path, 8, per_rep(speed, 40, 32, 50), 32 + 50 + 8))
    if "W4" in names:
        out.append(("W4", default_model.path, 8, per_rep(default_model, 400, 64, 4), 64 + 4 + 8))
    if "chat" in names:
        runs = []
        for r in range(reps):
            rng = random.Random(3 + 1000 * r)
            reqs = []
            for _ in range(64):
                n_words = rng.choice([10, 20, 40, 80, 160, 300])
                text = " ".join(rng.choice(bench_run.WORDS) for _ in range(n_words))
                reqs.append(dict(messages=[{"role": "system", "content": "You are a helpful assistant."},
                                           {"role": "user", "content": f"Summarise: {text}"}],
                                 gen=rng.choice([8, 16, 32, 64, 96])))
            runs.append(reqs)
        out.append(("chat", default_model.path, 8, runs, 512 + 96 + 8))
    return out


# (prompt tokens, new tokens) of the workloads with one shape: their raw llama.cpp ceiling.
RAW = "raw llama.cpp, one lockstep wave (ceiling)"
LOCKSTEP = {"W1": (32, 50), "W4": (64, 4), "G-np64": (32, 50), "G-np256": (32, 50)}


def lockstep_ceiling(tools: dict, path: str, users: int, shape: tuple, reps: int, threads: int) -> dict:
    """Raw llama.cpp decoding `users` sequences of `shape` at once, `reps` times: the median run."""
    pl, gl = shape
    runs = bench_run.batched_bench(tools["llama-batched-bench"], path, users, pl, gl, reps, threads, bench_run.Target.gpu)
    walls = sorted(t for _, _, t in runs)
    gen = [users * gl / t for t in walls]
    t = walls[len(walls) // 2]
    return dict(gen_s=users * gl / t, tot_s=users * (pl + gl) / t, all=sorted(gen))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpu", action="store_true", help="a CUDA build, every layer on the GPU, 64 and 256 users")
    ap.add_argument("--workloads", default="W1,W4,chat")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--speed-type", default="Q4_K_M", help="the speed model's type: Q4_K_M (default) or F16")
    ap.add_argument("--llama-settings", default=",".join(LLAMA_SERVER_SETTINGS),
                    help=f"llama-server settings to try, of {', '.join(LLAMA_SERVER_SETTINGS)}; none: fastpar alone")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--client-procs", type=int, default=None,
                    help="client processes sharing the users (default: users // 32, at most a quarter of the cores, "
                         "at least 1)")
    ap.add_argument("--stream-interval", type=int, default=1,
                    help="also run fastpar serve --stream-interval N (events of N tokens) when N > 1")
    ap.add_argument("--client", choices=("openai", "raw"), default="openai",
                    help="the users' client: the openai package, or raw (asyncio's own connections, JSON decoded only "
                         "for the usage: a load generator far lighter on the cores than the servers it loads)")
    ap.add_argument("--kv-unified", action="store_true",
                    help="also fastpar serve --kv-unified (one KV buffer for all slots)")
    ap.add_argument("--slots", type=int, default=None,
                    help="slots of every server and the Engine (default: one per user): more slots than users is a "
                         "server sized for its peak, where which idle slot a request takes matters on a GPU")
    ap.add_argument("--out", default=None, help="the result file (default bench/results/<machine>-server.md)")
    args = ap.parse_args()
    bench_run.Target.gpu = args.gpu
    bench_run.Target.n_gpu_layers = -1 if args.gpu else 0
    if args.gpu:
        bench_run.Target.baselines = bench_run.ROOT / "build" / "baselines-cuda"  # as bench/run.py --gpu
    tools = bench_run.build_baselines(server=True)
    speed_path = subprocess.run([sys.executable, str(HERE / "make_speed_model.py"), "--quantize-bin",
                                 tools["llama-quantize"], "--type", args.speed_type], capture_output=True, text=True,
                                check=True).stdout.strip().splitlines()[-1]
    ngl = bench_run.Target.n_gpu_layers
    speed = fastpar.Model(speed_path, n_gpu_layers=ngl)
    # The GPU workloads use the speed model alone (a GPU machine may have no network to fetch the default).
    default_model = None if args.gpu else fastpar.Model(fastpar.default_model_path(), n_gpu_layers=ngl)
    models = {m.path: m for m in (default_model, speed) if m is not None}
    load_before = os.getloadavg()
    rows = []
    notes: list = []
    for name, path, users, rep_reqs, n_ctx in workloads(args.workloads.split(","), default_model, speed, args.gpu,
                                                        args.reps):
        procs = args.client_procs or max(1, min(users // 32, (os.cpu_count() or 1) // 4))
        n_reqs = len(rep_reqs[0])
        slots = max(users, args.slots or users)
        print(f"== {name}: {n_reqs} requests, {users} users, {slots} slots, {procs} client process(es)", flush=True)
        runs: dict = {}
        failed: dict = {}
        servers = {"fastpar serve": fastpar_server(path, slots, n_ctx, args.threads),
                   FASTPAR_CACHE_OFF: fastpar_server(path, slots, n_ctx, args.threads, ["--prefix-cache-mib", "0"])}
        if args.stream_interval > 1:
            servers[f"fastpar serve --stream-interval {args.stream_interval}"] = fastpar_server(
                path, slots, n_ctx, args.threads, ["--stream-interval", str(args.stream_interval)])
        if args.kv_unified:
            servers["fastpar serve --kv-unified"] = fastpar_server(path, slots, n_ctx, args.threads, ["--kv-unified"])
        fields = {}  # a server's own request fields
        for setting, (extra, request_fields) in LLAMA_SERVER_SETTINGS.items():
            if setting in args.llama_settings.split(","):
                servers[f"llama-server {setting}"] = llama_server(tools["llama-server"], path, slots, n_ctx,
                                                                  args.threads, extra)
                fields[f"llama-server {setting}"] = request_fields
        try:
            with fastpar.Engine(models[path], n_parallel=slots, n_ctx_per_seq=n_ctx, n_threads=args.threads,
                                prefix_cache_mib=SERVE_PREFIX_CACHE_MIB) as e:
                for rep in range(args.reps):
                    reqs = rep_reqs[rep]
                    order = list(servers) + ["Engine in-process"]
                    if rep % 2:
                        order.reverse()
                    for who in order:
                        if who in failed:
                            continue
                        try:
                            if who == "Engine in-process":
                                r = asyncio.run(engine_load(e, reqs, users))
                            else:
                                r = http_load(servers[who].url, reqs, users, procs, args.client,
                                              fields=fields.get(who))
                        except (openai.APIError, ServerError) as err:  # a setting the server fails with: reported
                            failed[who] = f"{type(err).__name__}: {err}"
                            print(f"  {who}: failed: {failed[who]}", flush=True)
                            continue
                        runs.setdefault(who, []).append(r)
                        health = ""
                        if "health" in r:
                            ok = [x for x in r["health"] if x is not None]
                            health = (f", /health p50 {percentile(ok, 0.5) * 1000:.1f} ms p99 "
                                      f"{percentile(ok, 0.99) * 1000:.1f} ms ({len(r['health']) - len(ok)} failed)"
                                      if ok else ", /health never answered")
                        print(f"  {who}: {r['gen'] / r['wall']:.1f} gen tok/s, TTFT p50 "
                              f"{percentile(r['ttfts'], 0.5) * 1000:.0f} ms{health}", flush=True)
                c = e.prefix_cache_stats()  # what the server's default cache did in the Engine, every repetition
                notes.append(f"{name}: the Engine's prefix cache saved {c.n_saved} sequences to host memory and "
                             f"restored {c.n_restored}, copying for {c.t_host_ms / 1000:.2f} s; "
                             f"{c.n_not_saved} left unsaved while saved ones went unused")
        finally:
            for s in servers.values():
                s.close()
        notes.append(f"{name}: the HTTP load came from {procs} client process(es)")
        for who, why in failed.items():
            notes.append(f"{name}: {who} failed: {why}")
        summary = {}
        for who, rs in runs.items():
            med = sorted(rs, key=lambda r: r["gen"] / r["wall"])[len(rs) // 2]
            summary[who] = dict(gen_s=med["gen"] / med["wall"], tot_s=(med["gen"] + med["prompt"]) / med["wall"],
                                p50=percentile(med["ttfts"], 0.5), p99=percentile(med["ttfts"], 0.99),
                                all=[r["gen"] / r["wall"] for r in rs])
            if "health" in med:  # every probe of every repetition
                probes = [x for r in rs for x in r["health"]]
                ok = [x for x in probes if x is not None]
                summary[who].update(health_p50=percentile(ok, 0.5) if ok else None,
                                    health_p99=percentile(ok, 0.99) if ok else None,
                                    health_failed=len(probes) - len(ok), health_n=len(probes))
        llamas = [w for w in summary if w.startswith("llama-server")]  # none with --llama-settings none
        best_llama = max(llamas, key=lambda w: summary[w]["gen_s"]) if llamas else None
        if name in LOCKSTEP:
            summary[RAW] = lockstep_ceiling(tools, path, users, LOCKSTEP[name], args.reps, args.threads)
        best_all = summary[best_llama]["all"] if best_llama else []
        for who, s in summary.items():  # the ceiling runs apart from the servers: not paired
            s["paired"] = paired(s["all"], best_all) if who != RAW and len(s["all"]) == len(best_all) else None
            rows.append((name, users, n_reqs, who, s, s["gen_s"] / summary[best_llama]["gen_s"] if best_llama else None,
                         paired(summary["fastpar serve"]["all"], summary["Engine in-process"]["all"])
                         if who == "fastpar serve" else None, who == best_llama))
    load_after = os.getloadavg()

    machine = (f"GPU {bench_run.gpu_name()}" if args.gpu
               else f"CPU {platform.machine()}, {os.cpu_count()} cores, {args.threads} threads")
    lines = [f"# fastpar serve against llama-server ({'GPU' if args.gpu else 'CPU'})", "",
             f"`python bench/bench_server.py{' --gpu' if args.gpu else ''}"
             f"{f' --workloads {args.workloads}' if not args.gpu or 'mixed' in args.workloads else ''} "
             f"--reps {args.reps} --speed-type {args.speed_type} --llama-settings {args.llama_settings}"
             f"{f' --client-procs {args.client_procs}' if args.client_procs else ''}"
             f"{f' --client {args.client}' if args.client != 'openai' else ''}"
             f"{f' --stream-interval {args.stream_interval}' if args.stream_interval > 1 else ''}"
             f"{' --kv-unified' if args.kv_unified else ''}{f' --slots {args.slots}' if args.slots else ''}`; "
             f"fastpar {fastpar.__version__}, {machine}; "
             f"{time.strftime('%Y-%m-%d')}. Load average before {load_before[0]:.1f}, after {load_after[0]:.1f} "
             f"(other processes shared the machine when it is above the core count).", "",
             "Users send their next request when the last ends ("
             f"{'async openai client' if args.client == 'openai' else 'raw client: asyncio connections, JSON read only for the usage'}"
             ", streamed, ignore_eos); "
             f"{f'{args.slots} slots (at least one per user)' if args.slots else 'slots = users'}. "
             "Median of the repetitions by generated tokens/s; TTFT = send to first text. "
             "x llama-server: against llama-server's best setting (marked *); paired: the median over "
             "repetitions of that ratio within one repetition, whose servers run back to back. "
             "HTTP / in-process: fastpar serve against the Engine in the bench process on the same load, "
             "paired. "
             "Ceiling: raw llama.cpp (llama-batched-bench) decoding all the slots' prompts and answers of the "
             "workload's shape as one lockstep wave, median of as many runs. "
             "/health: GET /health every 50 ms during the load, on a new connection each time, from a thread of "
             "the bench; p50 and p99 over every repetition's probes (failed probes, if any, are counted apart).",
             "",
             "| workload | users | requests | server | gen tok/s | total tok/s | TTFT p50 ms | TTFT p99 ms "
             "| /health p50 ms | /health p99 ms | x llama-server | paired | HTTP / in-process | runs (gen tok/s) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, users, n_req, who, s, ratio, http_ratio, best in rows:
        ttft = "| | |" if who == RAW else f"| {s['p50'] * 1000:.0f} | {s['p99'] * 1000:.0f} |"
        if s.get("health_p50") is not None:
            health = f" {s['health_p50'] * 1000:.1f} | {s['health_p99'] * 1000:.1f} |"
        elif "health_n" in s:
            health = " never answered | |"
        else:
            health = " | |"
        if s.get("health_failed"):
            notes.append(f"{name}: {who}: {s['health_failed']} of {s['health_n']} /health probes failed")
        lines.append(f"| {name} | {users} | {n_req} | {who}{' *' if best else ''} | {s['gen_s']:.1f} | "
                     f"{s['tot_s']:.1f} {ttft}{health} {'' if ratio is None else f'{ratio:.2f}'} | "
                     f"{'' if s.get('paired') is None else format(s['paired'], '.2f')} | "
                     f"{'' if http_ratio is None else f'{http_ratio:.2f}'} | "
                     f"{', '.join(f'{x:.1f}' for x in s['all'])} |")
    lines += [""] + [f"* {n}" for n in notes]
    text = "\n".join(lines) + "\n"
    out = args.out
    if out is None:
        tag = ("gpu-" + bench_run.gpu_name().lower() if args.gpu
               else f"cpu-{platform.machine()}-{os.cpu_count()}core")
        out = HERE / "results" / f"{tag}-server.md"
    pathlib.Path(out).write_text(text)
    print(text)
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
