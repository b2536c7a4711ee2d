"""Data-parallel scale-out with fastpar.ray: rows/s of one job at 1 and 2 actors.

    python bench/bench_ray.py                                  # CPU: 2 actors x 1 CPU vs 1 x 1, vs generate_parallel
    python bench/bench_ray.py --out bench/results/cpu-x86_64-2core-ray.md
    python bench/bench_ray.py --gpu                            # one actor per GPU, speed model, 1 and 2 GPUs
    python bench/bench_ray.py --gpu --no-ray                   # the same without Ray: one process per GPU

CPU (default model): the same rows (prompts of --prompt-tokens tokens, --max-tokens new
tokens each, greedy, ignore_eos) through
  * ray-2x1: build_processor, 2 actors with 1 CPU each (a local cluster of 2 CPUs),
  * ray-1x1: 1 actor with 1 CPU,
  * gp-2t:   generate_parallel in this process with 2 threads and as many slots as both
             actors together (the same total threads: the cost of Ray's plumbing).
GPU (--gpu, the F16 speed model of make_speed_model.py, built here when missing): one actor
per GPU (num_gpus=1, every layer on it), 1 and 2 GPUs; --no-ray: 1 and 2 worker processes,
each with CUDA_VISIBLE_DEVICES set to its GPU, each generating its share of the rows.
Every job is timed whole, actor start and model load included (what a user waits for);
settings run interleaved, --reps rounds after a warm-up round; medians. "Once started":
rows/s from the first finished batch to the last row (generate_parallel: the call without
the model load; --no-ray: the slowest worker's call). Beside the wall
time, the CPU seconds of the processes that did the work (the actors, from their start;
generate_parallel's own process during the call): on a machine whose cores other
sessions keep busy, a session's processes share one slice of CPU, so the wall time of 2
actors need not beat 1 there while the CPU per job shows what each costs.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import random
import statistics
import subprocess
import sys
import time

import fastpar

HERE = pathlib.Path(__file__).resolve().parent
WORDS = ("the river city market light paper stone window garden music table winter morning "
         "letter story mountain forest bridge harbor street summer evening number circle").split()


def make_prompts(model: fastpar.Model, n: int, n_tokens: int, seed: int = 0) -> list:
    """n distinct prompts of exactly n_tokens tokens each."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        text = rng.choice(WORDS)
        while len(model.tokenize(text)) < n_tokens:
            text += " " + rng.choice(WORDS)
        while len(model.tokenize(text)) > n_tokens:
            text = text.rsplit(" ", 1)[0]
        out.append(text)
    return out


def speed_model_path() -> str:
    sys.path.insert(0, str(HERE))
    from make_speed_model import build

    return str(build("", "F16"))  # F16 needs no llama-quantize


# ----------------------------------------------------------------------------- runs

def ray_job(ray, model_path: str, prompts: list, sp: dict, *, actors: int, num_cpus: float, num_gpus: float,
            n_parallel: int, n_ctx: int, n_gpu_layers: int, batch_size: int) -> float:
    from fastpar.ray import FastparProcessorConfig, build_processor

    config = FastparProcessorConfig(model_path, n_parallel=n_parallel, n_ctx_per_seq=n_ctx, n_gpu_layers=n_gpu_layers,
                                    num_cpus=num_cpus, num_gpus=num_gpus, concurrency=actors, batch_size=batch_size,
                                    max_concurrent_batches=4, sampling_params=sp)
    ds = ray.data.from_items([{"prompt": p} for p in prompts], override_num_blocks=max(8, 4 * actors))
    # postprocess runs in the actor: each row records its actor and that process's CPU time
    post = lambda row: {"err": row["__inference_error__"], "pid": os.getpid(), "cpu": time.process_time(),  # noqa: E731
                        "t": time.time()}
    t0 = time.perf_counter()
    out = build_processor(config, postprocess=post)(ds).take_all()
    wall = time.perf_counter() - t0
    bad = [r["err"] for r in out if r["err"]]
    assert len(out) == len(prompts) and not bad, bad[:3]
    cpu = {}
    for r in out:
        cpu[r["pid"]] = max(cpu.get(r["pid"], 0.0), r["cpu"])
    return wall, sum(cpu.values()), len(cpu), steady_rate([r["t"] for r in out])


def steady_rate(done: list) -> float:
    """Rows/s once the first batch is out (actors started, models loaded): the rows finished
    after the first one's batch over the time from it to the last."""
    done = sorted(done)
    first = [t for t in done if t - done[0] < 0.05]
    return (len(done) - len(first)) / (done[-1] - done[0]) if done[-1] > done[0] else float("nan")


def gp_job(model_path: str, prompts: list, sp: dict, *, n_threads: int, n_parallel: int, n_ctx: int,
           n_gpu_layers: int) -> float:
    t0, c0 = time.perf_counter(), time.process_time()
    model = fastpar.Model(model_path, n_gpu_layers=n_gpu_layers)
    ctx = fastpar.Context(model, n_parallel=n_parallel, n_ctx_per_seq=n_ctx, n_threads=n_threads)
    t1 = time.perf_counter()
    out = fastpar.generate_parallel(ctx, prompts, fastpar.SamplingParams(**sp))
    t2 = time.perf_counter()
    wall, cpu = t2 - t0, time.process_time() - c0
    assert all(c.finish_reason == "length" for c in out), [c.error for c in out if c.error][:3]
    return wall, cpu, 1, len(prompts) / (t2 - t1)


def process_job(model_path: str, prompts: list, sp: dict, *, gpus: int, n_parallel: int, n_ctx: int,
                n_gpu_layers: int) -> float:
    """--no-ray: gpus worker processes (this script with --worker), one per GPU, each on
    its share of the rows; the wall time until the last one is done."""
    shares = [prompts[i::gpus] for i in range(gpus)]
    t0 = time.perf_counter()
    procs = []
    for g, share in enumerate(shares):
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(g))
        job = json.dumps(dict(model=model_path, prompts=share, sp=sp, n_parallel=n_parallel, n_ctx=n_ctx,
                              n_gpu_layers=n_gpu_layers))
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker"], env=env, stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True))
        procs[-1].stdin.write(job)
        procs[-1].stdin.close()
    gen_s = []
    for p in procs:
        report = p.stdout.read()
        if p.wait() != 0:
            raise RuntimeError(f"a worker process failed ({p.returncode})")
        gen_s.append(json.loads(report)["gen_s"])
    return time.perf_counter() - t0, float("nan"), gpus, len(prompts) / max(gen_s)


def worker() -> int:
    job = json.loads(sys.stdin.read())
    _, _, _, rate = gp_job(job["model"], job["prompts"], job["sp"], n_threads=None, n_parallel=job["n_parallel"],
                           n_ctx=job["n_ctx"], n_gpu_layers=job["n_gpu_layers"])
    print(json.dumps(dict(gen_s=len(job["prompts"]) / rate)))  # the generation's time alone
    return 0


# ----------------------------------------------------------------------------- main

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", action="store_true", help="one actor per GPU, speed model, at 1 and 2 GPUs")
    ap.add_argument("--no-ray", action="store_true", help="with --gpu: one process per GPU instead of Ray actors")
    ap.add_argument("--rows", type=int, default=None, help="rows per job (CPU 160, GPU 16384)")
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=None, help="new tokens per row (CPU 16, GPU 64)")
    ap.add_argument("--n-parallel", type=int, default=None, help="slots per actor (CPU 8, GPU 128)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--model", default=None, help="a GGUF instead of the default (CPU) or speed model (GPU)")
    ap.add_argument("--out", default=None, help="write the table (markdown) here")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker()

    gpu = args.gpu
    rows = args.rows or (16384 if gpu else 160)
    max_tokens = args.max_tokens or (64 if gpu else 16)
    n_par = args.n_parallel or (128 if gpu else 8)
    model_path = args.model or (speed_model_path() if gpu else fastpar.default_model_path())
    gpu_layers = -1 if fastpar.backend() != "cpu" else 0  # --gpu on a CPU build: only checks the script
    prompts = make_prompts(fastpar.Model(model_path), rows, args.prompt_tokens)
    sp = dict(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    n_ctx = args.prompt_tokens + max_tokens + 8

    ray = None
    if not (gpu and args.no_ray):
        # Ray starts its workers 15 nice levels below the driver; the generate_parallel
        # baseline runs in the driver, so on a shared machine the actors would lose CPU to
        # everyone else and the comparison would measure priority, not Ray.
        os.environ.setdefault("RAY_worker_niceness", "0")
        import ray

        resources = dict(num_gpus=2) if gpu else {}
        ray.init(num_cpus=(os.cpu_count() if gpu else 2), include_dashboard=False, log_to_driver=False,
                 configure_logging=False, **resources)
        ctx = ray.data.DataContext.get_current()
        ctx.enable_progress_bars = False
    if gpu and args.no_ray:
        settings = {f"proc-{g}gpu": (lambda g=g: process_job(model_path, prompts, sp, gpus=g, n_parallel=n_par,
                                                             n_ctx=n_ctx, n_gpu_layers=gpu_layers))
                    for g in (1, 2)}
    elif gpu:
        actor_cpus = max(1, (os.cpu_count() or 2) // 2)
        settings = {f"ray-{g}gpu": (lambda g=g: ray_job(ray, model_path, prompts, sp, actors=g, num_cpus=actor_cpus,
                                                        num_gpus=1, n_parallel=n_par, n_ctx=n_ctx, n_gpu_layers=gpu_layers,
                                                        batch_size=n_par)) for g in (1, 2)}
    else:
        common = dict(n_parallel=n_par, n_ctx=n_ctx, n_gpu_layers=0)
        settings = {
            "ray-2x1": lambda: ray_job(ray, model_path, prompts, sp, actors=2, num_cpus=1, num_gpus=0,
                                       batch_size=n_par, **common),
            "ray-1x1": lambda: ray_job(ray, model_path, prompts, sp, actors=1, num_cpus=1, num_gpus=0,
                                       batch_size=n_par, **common),
            "gp-2t": lambda: gp_job(model_path, prompts, sp, n_threads=2, n_parallel=2 * n_par, n_ctx=n_ctx,
                                    n_gpu_layers=0),
        }

    walls = {name: [] for name in settings}
    cpu_s = {name: [] for name in settings}
    steady = {name: [] for name in settings}
    names = list(settings)
    for rep in range(args.reps + 1):  # round 0 warms up (page cache, Ray's worker pool)
        for k in range(len(names)):
            name = names[(k + rep) % len(names)]  # each round starts one setting later
            wall, cpu, workers, rate_up = settings[name]()
            print(f"round {rep}{' (warm-up)' if rep == 0 else ''}: {name:8s} {rows / wall:8.2f} rows/s "
                  f"({wall:.1f} s; {rate_up:.2f} rows/s once started; {cpu:.1f} CPU s in {workers} worker "
                  "process(es))", flush=True)
            if rep:
                walls[name].append(wall)
                cpu_s[name].append(cpu)
                steady[name].append(rate_up)
    rate = {name: rows / statistics.median(w) for name, w in walls.items()}
    up = {name: statistics.median(v) for name, v in steady.items()}

    lines = [f"# fastpar.ray scale-out ({'GPU' if gpu else 'CPU'})", "",
             f"`python bench/bench_ray.py {' '.join(sys.argv[1:])}`: {rows} rows, {args.prompt_tokens} prompt tokens, "
             f"{max_tokens} new tokens (greedy, ignore_eos), {n_par} slots per engine; median of {args.reps} "
             f"interleaved rounds after a warm-up; whole jobs timed, actor start and model load included.", "",
             f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, {platform.python_version()}, fastpar "
             f"{fastpar.__version__} ({fastpar.backend()})"
             + (f", ray {ray.__version__}" if ray is not None else "") + ".", "",
             "| setting | rows/s, whole job (median) | each round (s) | rows/s once started (median) "
             "| CPU s of the work processes (median) |",
             "|---|---:|---|---:|---:|"]
    for name in names:
        lines.append(f"| {name} | {rate[name]:.2f} | {', '.join(f'{w:.1f}' for w in walls[name])} | {up[name]:.2f} | "
                     f"{statistics.median(cpu_s[name]):.1f} |")
    lines.append("")
    if gpu:
        a, b = names
        lines.append(f"2 GPUs / 1 GPU: **{rate[b] / rate[a]:.2f}x** whole job, **{up[b] / up[a]:.2f}x** once "
                     "started (target >= 1.8)")
    else:
        lines.append(f"2 actors / 1 actor: **{rate['ray-2x1'] / rate['ray-1x1']:.2f}x** whole job, "
                     f"**{up['ray-2x1'] / up['ray-1x1']:.2f}x** once started (bar >= 1.7)")
        lines.append(f"2 actors / generate_parallel with 2 threads: **{rate['ray-2x1'] / rate['gp-2t']:.2f}x** "
                     f"whole job, **{up['ray-2x1'] / up['gp-2t']:.2f}x** once started (bar >= 0.9)")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        pathlib.Path(args.out).write_text(text)
    if ray is not None:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
