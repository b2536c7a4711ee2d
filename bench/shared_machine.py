#!/usr/bin/env python3
"""fastpar and raw llama.cpp on a machine they do not have to themselves.

One generate_parallel call (default model, 8 prompts of 70 tokens, 50 new tokens each,
greedy, default threads) and raw llama-batched-bench with the same shapes and threads
(-npp 70 -ntg 50 -npl 8 -t <fastpar's default threads>), each

  alone        with the machine to itself;
  busy         beside one busy process (a Python `while True: pass`);
  pair         two such processes started together (each one's time counts);

as the median of interleaved repetitions, with each one's ratio to its time alone, and
fastpar's time against raw's under the same load. Writes
bench/results/cpu-<machine>-<N>core-shared-machine.{json,md}:

    python bench/shared_machine.py                  # 3 repetitions
    python bench/shared_machine.py --reps 5 --env GOMP_SPINCOUNT=300000   # fastpar under other settings

Raw llama.cpp runs with the environment this script was started with (fastpar's own
OpenMP setting is not passed on: docs/performance.md). Time the machine is busy with other
work shows up in every row: run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

# The environment as it was before fastpar's import, for raw llama.cpp's processes.
ORIGINAL_ENV = dict(os.environ)

import fastpar  # noqa: E402
import fastpar._testing  # noqa: E402  (available_cpus: fastpar's default threads)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from run import build_baselines, make_prompts, physical_batch  # noqa: E402

N_PARALLEL, PROMPT_TOKENS, GEN_TOKENS = 8, 70, 50
LOADS = ("alone", "busy", "pair")

CHILD = r"""
import json, sys, time
import fastpar
sys.path.insert(0, {here!r})
from run import make_prompts
model = fastpar.Model({model!r})
ctx = fastpar.Context(model, n_parallel={n_par}, n_ctx_per_seq={n_ctx})
prompts = make_prompts(model, {n_par}, {pl}, 0)
print("ready", flush=True)
sys.stdin.readline()  # go: every process of a load starts its call at once
t0 = time.perf_counter()
res = fastpar.generate_parallel(ctx, prompts, max_tokens={gl}, temperature=0.0, ignore_eos=True)
wall = time.perf_counter() - t0
print(json.dumps(dict(wall_s=wall, n_threads=ctx.n_threads, n_gen_tokens=sum(c.n_gen_tokens for c in res),
                      n_prompt_tokens=sum(c.n_prompt_tokens for c in res))), flush=True)
"""


def fastpar_procs(n: int, model: str, env: dict) -> list:
    """n fastpar processes, each loaded and ready; their calls start together -> [wall seconds]."""
    code = CHILD.format(here=HERE, model=model, n_par=N_PARALLEL, n_ctx=PROMPT_TOKENS + GEN_TOKENS + 8,
                        pl=PROMPT_TOKENS, gl=GEN_TOKENS)
    procs = [subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env=env) for _ in range(n)]
    for p in procs:
        if p.stdout.readline().strip() != "ready":
            raise RuntimeError(f"a fastpar process did not start: exit {p.wait()}")
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    out = []
    for p in procs:
        line = p.stdout.read().strip().splitlines()[-1]
        if p.wait() != 0:
            raise RuntimeError(f"a fastpar process failed: exit {p.returncode}")
        r = json.loads(line)
        if r["n_gen_tokens"] != N_PARALLEL * GEN_TOKENS:
            raise RuntimeError(f"a fastpar process generated {r['n_gen_tokens']} tokens")
        out.append(r["wall_s"])
    return out


def raw_procs(n: int, binary: str, model: str, threads: int) -> list:
    """n llama-batched-bench processes started together -> [their wave's T in seconds]."""
    ub = physical_batch(False)
    cmd = [binary, "-m", model, "-c", str(N_PARALLEL * (PROMPT_TOKENS + GEN_TOKENS + 16)), "-b", ub, "-ub", ub,
           "-npp", str(PROMPT_TOKENS), "-ntg", str(GEN_TOKENS), "-npl", str(N_PARALLEL), "-t", str(threads),
           "-no-kvu"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=ORIGINAL_ENV)
             for _ in range(n)]
    out = []
    for p in procs:
        text = p.communicate()[0]
        if p.returncode != 0:
            raise RuntimeError(f"llama-batched-bench failed: exit {p.returncode}")
        rows = [ln for ln in text.splitlines() if ln.startswith("|") and ln.split("|")[1].strip().isdigit()]
        out.append(float(rows[-1].strip("|").split("|")[8]))  # T s: the whole wave
    return out


def under(load: str, run) -> list:
    """run(n_processes) under a load -> every process's seconds."""
    if load == "alone":
        return run(1)
    if load == "pair":
        return run(2)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"], env=ORIGINAL_ENV)
    try:
        time.sleep(0.5)  # the busy process runs before the measured one starts
        return run(1)
    finally:
        busy.kill()
        busy.wait()


def loadavg() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


def markdown(meta: dict, summary: dict) -> str:
    lines = [f"# fastpar on a shared machine, {meta['date']}, {meta['host_kind']}", "",
             f"`{meta['command']}`: one `generate_parallel` call ({meta['model']}, {N_PARALLEL} prompts of "
             f"{PROMPT_TOKENS} tokens, {GEN_TOKENS} new tokens, greedy, n_threads={meta['threads']}) and "
             f"`llama-batched-bench` with the same shapes and `-t {meta['threads']}`; medians of "
             f"{meta['reps']} interleaved repetitions (two at once: every process's time). "
             f"fastpar's environment: {meta['fastpar_env'] or 'as started'}; 1-minute load average before "
             f"the runs: {', '.join(f'{x:.1f}' for x in meta['loadavg_before'])}.", "",
             "| load | fastpar s | x alone | raw llama.cpp s | x alone | fastpar / raw |",
             "|---|---:|---:|---:|---:|---:|"]
    names = {"alone": "alone", "busy": "beside one busy process", "pair": "two processes at once"}
    for load in LOADS:
        f, r = summary["fastpar"][load], summary.get("raw", {}).get(load)
        raw = (f"{r['wall_s']:.2f} | {r['x_alone']:.2f} | {f['wall_s'] / r['wall_s']:.2f}" if r
               else "not run | | ")
        lines.append(f"| {names[load]} | {f['wall_s']:.2f} | {f['x_alone']:.2f} | {raw} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="set for fastpar's processes only (to compare OpenMP settings)")
    parser.add_argument("--host-kind", default=None, help="default cpu-<machine>-<N>core")
    parser.add_argument("--out", default=None, help="results stem (default bench/results/<host-kind>-shared-machine)")
    parser.add_argument("--model", default=None, help="a GGUF file (default: the default model)")
    parser.add_argument("--skip-raw", action="store_true",
                        help="fastpar only (to compare its settings; the table then has no raw column)")
    args = parser.parse_args()

    threads = fastpar._testing.available_cpus()
    host_kind = args.host_kind or f"cpu-{platform.machine()}-{threads}core"
    stem = args.out or os.path.join(HERE, "results", f"{host_kind}-shared-machine")
    tools = build_baselines(server=False)
    model = args.model or fastpar.default_model_path()
    make_prompts(fastpar.Model(model), 1, PROMPT_TOKENS, 0)  # fails here, not in a child, if it cannot
    env = dict(ORIGINAL_ENV)
    extra = dict(kv.split("=", 1) for kv in args.env)
    env.update(extra)

    runs = {"fastpar": {load: [] for load in LOADS}, "raw": {load: [] for load in LOADS}}
    loads_seen = []
    for rep in range(args.reps):
        order = LOADS[rep % len(LOADS):] + LOADS[:rep % len(LOADS)]
        for load in order:
            loads_seen.append(loadavg())
            f = under(load, lambda n: fastpar_procs(n, model, env))
            r = [] if args.skip_raw else under(
                load, lambda n: raw_procs(n, tools["llama-batched-bench"], model, threads))
            runs["fastpar"][load] += f
            runs["raw"][load] += r
            print(f"rep {rep + 1} {load:5s}: fastpar {' '.join(f'{x:.2f}' for x in f)} s, "
                  f"raw {' '.join(f'{x:.2f}' for x in r)} s (load {loads_seen[-1]:.1f})", flush=True)

    summary = {}
    for engine, per_load in runs.items():
        if not per_load["alone"]:
            continue
        alone = statistics.median(per_load["alone"])
        summary[engine] = {load: dict(wall_s=statistics.median(v), x_alone=statistics.median(v) / alone, walls_s=v)
                           for load, v in per_load.items()}
    meta = dict(date=datetime.date.today().isoformat(), host_kind=host_kind, threads=threads, reps=args.reps,
                fastpar=fastpar.__version__, fastpar_env=extra, model=os.path.basename(model), loadavg_before=loads_seen,
                command="python bench/shared_machine.py " + " ".join(sys.argv[1:]),
                shapes=dict(n_parallel=N_PARALLEL, prompt_tokens=PROMPT_TOKENS, gen_tokens=GEN_TOKENS))
    os.makedirs(os.path.dirname(stem), exist_ok=True)
    with open(stem + ".json", "w") as fh:
        json.dump(dict(meta=meta, summary=summary), fh, indent=2)
        fh.write("\n")
    table = markdown(meta, summary)
    with open(stem + ".md", "w") as fh:
        fh.write(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
