#!/usr/bin/env python3
"""Multi-turn chat, the load real chat users make: `fastpar serve` with its prefix cache on
and off against llama-server (its prompt cache at its defaults and at other settings).

--users users (default 8) each hold one conversation of --turns turns (default 8). Every
user has a system prompt of its own, --system-tokens long (default 500): distinct per user,
so a turn can only reuse its own conversation's earlier turns, never another user's. Each
turn appends a user message of --turn-tokens (default 150) and asks for --new-tokens
(default 32) new tokens, greedy, ignore_eos (every answer is exactly that long); the answer
comes back into the conversation as an assistant message for the next turn, as a chat
client does. The users run at once, each with the async `openai` client, streamed (to
measure time to first token), each sending its next turn as soon as its last answer ends.
Texts are common words counted with the model's tokenizer (bench/run.py make_prompts), so
the chat template adds a few tokens to each message.

Servers, each with --parallel slots (default: one per user), --threads threads and a
context per slot that holds a whole conversation (at least 4096):
  * fastpar serve --prefix-cache-mib -1 (prefix cache on, auto budget: the server's default);
  * fastpar serve --prefix-cache-mib 0 (prefix cache off; --fastpar-settings on leaves it out);
  * with --kv-unified, fastpar serve --prefix-cache-mib -1 --kv-unified (one KV buffer);
  * llama-server at its defaults (cache_prompt on, --cache-ram 8192 MiB) and at each other
    setting of LLAMA_SETTINGS; the fastest of these by generated tokens/s is "best".
Each server is started afresh for every run (no cache survives from an earlier run) and
closed after it; the servers take turns within a repetition, the order rotated by one each
repetition. Reported per server, medians over --reps repetitions: generated tokens/s over
the whole load, TTFT p50 and p90 over its requests, the prompt tokens the requests held
and those reused from a cache (fastpar: fastpar_prefix_cache_tokens_reused_total,
llama-server: llamacpp:prompt_tokens_cached_total, from /metrics), and the ratios against
llama-server's defaults and its best, each the median over repetitions of the ratio within
one repetition.

    python bench/bench_multiturn.py                                   # 8 users x 8 turns, CPU
    python bench/bench_multiturn.py --gpu --users 64 --out multiturn.md
    python bench/bench_multiturn.py --users 2 --turns 2 --system-tokens 60 --reps 1   # check the harness

Needs `pip install 'fastpar[server]' openai` and a checkout (llama-server builds from it,
bench/run.py build_baselines).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import time
import urllib.request

import fastpar

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bench_server  # noqa: E402  (fastpar_server, llama_server, async_client, stream, percentile, paired)
import run as bench_run  # noqa: E402  (build_baselines, make_prompts, Target)

# llama-server settings tried beside fastpar (each with --metrics, which only adds /metrics,
# read after a load). Its defaults keep each slot's prompt in the KV cache (cache_prompt) and
# up to 8192 MiB of prompts in host memory (--cache-ram); 0 turns that host cache off, -1
# lifts its limit; -kvu shares one KV buffer among the slots (its default without -np).
LLAMA_SETTINGS = {"defaults": [], "cache-ram-0": ["--cache-ram", "0"], "cache-ram-unlimited": ["--cache-ram", "-1"],
                  "kvu": ["-kvu"]}
FASTPAR_ON, FASTPAR_OFF = "fastpar serve --prefix-cache-mib -1", "fastpar serve --prefix-cache-mib 0"
REUSED = {"fastpar": "fastpar_prefix_cache_tokens_reused_total", "llama": "llamacpp:prompt_tokens_cached_total"}


def require_prefix_cache() -> None:
    """Exits at once, before any build or load, where `fastpar serve` has no prefix cache."""
    out = subprocess.run([sys.executable, "-m", "fastpar", "serve", "--help"], capture_output=True, text=True).stdout
    if "--prefix-cache-mib" not in out:
        sys.exit("bench_multiturn.py: this fastpar's `serve` has no --prefix-cache-mib (no prefix cache)")


def conversations(model: fastpar.Model, args) -> list:
    """Per user: (system prompt, [user message of each turn])."""
    systems = bench_run.make_prompts(model, args.users, args.system_tokens, 0, seed=1)
    turns = bench_run.make_prompts(model, args.users * args.turns, args.turn_tokens, 0, seed=2)
    return [(s, turns[u * args.turns:(u + 1) * args.turns]) for u, s in enumerate(systems)]


async def chat_load(url: str, convs: list, new_tokens: int) -> dict:
    """Every user's conversation at once -> wall seconds, generated and prompt tokens, every TTFT."""
    ttfts, gen, prompt = [], [0], [0]
    async with bench_server.async_client(url, len(convs)) as client:
        async def user(system: str, messages: list) -> None:
            history = [{"role": "system", "content": system}]
            for m in messages:
                history.append({"role": "user", "content": m})
                r = await bench_server.stream(client, dict(
                    model="m", messages=history, max_tokens=new_tokens, temperature=0.0, stream=True,
                    stream_options={"include_usage": True}, extra_body={"top_k": 1, "ignore_eos": True}))
                history.append({"role": "assistant", "content": r["text"]})
                ttfts.append(r["ttft"])
                gen[0] += r["gen"]
                prompt[0] += r["prompt"]

        t0 = time.perf_counter()
        await asyncio.gather(*(user(s, ms) for s, ms in convs))
    return dict(wall=time.perf_counter() - t0, gen=gen[0], prompt=prompt[0], ttfts=ttfts)


def metrics(port: int, *names: str) -> list:
    """The sum of each named /metrics counter's samples (one scrape), or None where the server
    has none of that name."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        lines = r.read().decode().splitlines()
    out = []
    for name in names:
        values = [float(ln.rsplit(" ", 1)[1]) for ln in lines if ln.split("{")[0].split(" ")[0] == name]
        out.append(sum(values) if values else None)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--users", type=int, default=8)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--system-tokens", type=int, default=500)
    ap.add_argument("--turn-tokens", type=int, default=150)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--parallel", type=int, default=None, help="slots of every server (default: --users)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--model", default=None, help="GGUF file (default: fastpar's default model)")
    ap.add_argument("--gpu", action="store_true", help="a CUDA build, every layer on the GPU")
    ap.add_argument("--llama-settings", default=",".join(LLAMA_SETTINGS),
                    help=f"llama-server settings to try, of: {', '.join(LLAMA_SETTINGS)} (comma-separated)")
    ap.add_argument("--fastpar-settings", default="on,off",
                    help="fastpar serve with its prefix cache on, off or both (default: on,off)")
    ap.add_argument("--kv-unified", action="store_true",
                    help="also fastpar serve with its prefix cache on and one KV buffer for all slots")
    ap.add_argument("--out", default=None, help="also write the markdown table to this file")
    args = ap.parse_args()
    n_par = args.parallel or args.users
    settings = args.llama_settings.split(",")
    if "defaults" not in settings or any(s not in LLAMA_SETTINGS for s in settings):
        ap.error(f"--llama-settings: 'defaults' and any of {', '.join(LLAMA_SETTINGS)}")
    if not set(args.fastpar_settings.split(",")) <= {"on", "off"}:
        ap.error("--fastpar-settings: on, off or on,off")
    require_prefix_cache()
    bench_run.Target.gpu, bench_run.Target.n_gpu_layers = args.gpu, -1 if args.gpu else 0
    if args.gpu:
        bench_run.Target.baselines = bench_run.ROOT / "build" / "baselines-cuda"  # as bench/run.py --gpu
    llama_bin = bench_run.build_baselines(server=True)["llama-server"]
    path = args.model or fastpar.default_model_path()
    convs = conversations(fastpar.Model(path), args)  # the tokenizer only: no layer on a GPU
    # A whole conversation per slot: every message, its template's tokens (a few) and answer.
    n_ctx = max(4096, args.system_tokens + args.turns * (args.turn_tokens + args.new_tokens + 32) + 64)

    fastpar_settings = {"on": (FASTPAR_ON, "-1"), "off": (FASTPAR_OFF, "0")}
    servers = {name: (lambda mib=mib: bench_server.fastpar_server(path, n_par, n_ctx, args.threads,
                                                                  ["--prefix-cache-mib", mib]))
               for key, (name, mib) in fastpar_settings.items() if key in args.fastpar_settings.split(",")}
    if args.kv_unified:
        servers[f"{FASTPAR_ON} --kv-unified"] = lambda: bench_server.fastpar_server(
            path, n_par, n_ctx, args.threads, ["--prefix-cache-mib", "-1", "--kv-unified"])
    for s in settings:
        servers[f"llama-server {' '.join(LLAMA_SETTINGS[s]) or s}"] = (lambda s=s: bench_server.llama_server(
            llama_bin, path, n_par, n_ctx, args.threads, ["--metrics", *LLAMA_SETTINGS[s]]))
    print(f"{args.users} users x {args.turns} turns, {args.system_tokens}-token system prompts, "
          f"{args.turn_tokens}-token messages, {args.new_tokens} new tokens; {n_par} slots of {n_ctx}", flush=True)
    load_before = os.getloadavg()
    runs: dict = {who: [] for who in servers}
    for rep in range(args.reps):
        names = list(servers)
        for who in names[rep % len(names):] + names[:rep % len(names)]:
            server = servers[who]()
            try:
                r = asyncio.run(chat_load(server.url, convs, args.new_tokens))
                # fastpar's own count from submission to the first token: the rest of the client's
                # time to first token is HTTP, the chat template and the client.
                r["reused"], n, t = metrics(server.port, REUSED["fastpar" if who.startswith("fastpar") else "llama"],
                                            "fastpar_time_to_first_token_seconds_count",
                                            "fastpar_time_to_first_token_seconds_sum")
                r["engine_ttft"] = t / n if n else None
            finally:
                server.close()
            r.update(gen_s=r["gen"] / r["wall"], p50=bench_server.percentile(r["ttfts"], 0.5),
                     p90=bench_server.percentile(r["ttfts"], 0.9))
            runs[who].append(r)
            print(f"rep {rep} {who}: {r['gen_s']:.1f} gen tok/s, TTFT p50 {r['p50'] * 1000:.0f} ms, "
                  f"p90 {r['p90'] * 1000:.0f} ms, {r['prompt']} prompt tokens, reused {r['reused']}"
                  + (f"; TTFT mean {statistics.mean(r['ttfts']) * 1000:.0f} ms, in the engine "
                     f"{r['engine_ttft'] * 1000:.0f} ms" if r["engine_ttft"] is not None else ""), flush=True)

    def med(who, key):
        xs = [r[key] for r in runs[who]]
        return None if None in xs else statistics.median(xs)

    llama = [w for w in servers if w.startswith("llama-server")]
    best = max(llama, key=lambda w: med(w, "gen_s"))
    base = {"defaults": "llama-server defaults", "best": best}

    def ratio(who, key, against):
        return bench_server.paired([r[key] for r in runs[who]], [r[key] for r in runs[base[against]]])

    machine = (f"GPU {bench_run.gpu_name()}" if args.gpu
               else f"CPU {platform.machine()}, {os.cpu_count()} cores, {args.threads} threads")
    lines = ["# Multi-turn chat: fastpar serve against llama-server", "",
             f"`python bench/bench_multiturn.py {' '.join(sys.argv[1:])}`; fastpar {fastpar.__version__}, "
             f"{machine}, model {pathlib.Path(path).name}; {time.strftime('%Y-%m-%d')}. {args.users} users x "
             f"{args.turns} turns: a {args.system_tokens}-token system prompt per user, {args.turn_tokens}-token "
             f"messages, {args.new_tokens} new tokens a turn (greedy, ignore_eos), answers kept in the "
             f"conversation; {n_par} slots of {n_ctx} positions. Medians of {args.reps} repetitions; ratios: "
             f"the median of the ratio within a repetition; TTFT ratios below 1 are faster. llama-server's best: "
             f"{best}. Load average before {load_before[0]:.1f}, after {os.getloadavg()[0]:.1f}.", "",
             "| server | gen tok/s | TTFT p50 ms | TTFT p90 ms | prompt tokens | reused from a cache | "
             "tok/s x defaults | TTFT p50 x defaults | tok/s x best | TTFT p50 x best | runs (gen tok/s) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for who in servers:
        reused = med(who, "reused")
        lines.append(f"| {who}{' *' if who == best else ''} | {med(who, 'gen_s'):.1f} | {med(who, 'p50') * 1000:.0f} | "
                     f"{med(who, 'p90') * 1000:.0f} | {med(who, 'prompt'):.0f} | "
                     f"{'-' if reused is None else f'{reused:.0f}'} | "
                     + " | ".join(f"{ratio(who, k, b):.2f}" for b in ("defaults", "best") for k in ("gen_s", "p50"))
                     + " | " + ", ".join(f"{r['gen_s']:.1f}" for r in runs[who]) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        pathlib.Path(args.out).write_text(text)
        print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
