#!/usr/bin/env python3
"""fastpar side by side with raw llama.cpp, llama-server and llama-cpp-python.

One command builds what it needs (the baselines from vendor/llama.cpp, the synthetic
speed model, the C stage, the llama-cpp-python peer from the same pinned sdist), runs
every selected stage on every selected workload, interleaving the repetitions, and
writes bench/results/<host-kind>.{json,md,png} (or --out STEM; the date is inside, git keeps
earlier runs):

    python bench/run.py                      # everything: W1-W4, greedy and typical, 3 reps
    python bench/run.py --workloads W1 --reps 3
    python bench/run.py --gpu                # CUDA build, all layers on the GPU (see bench/README.md)

Stages: 0 raw llama-batched-bench; 1 C ABI from C; 2 Python generate_parallel;
3 Engine fed by max(8, N) threads; 4 llama-server -np N with N HTTP clients on loopback;
5 llama-cpp-python, one prompt at a time; on a GPU also 6 transformers generate (bf16),
7 and 8 generate_parallel sampling on the host and on the GPU. Each reports generated
and total tokens per second of wall time, and its ratio to stage 0. See bench/README.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import random
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

import fastpar
import fastpar._testing  # cpu_batch, gpu_batch: needs a build with FASTPAR_TESTING (the default)

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
BASELINES = ROOT / "build" / "baselines"
PEER_VENV = ROOT / "build" / "peer-venv"
SDIST = "llama_cpp_python-0.3.36.tar.gz"

STAGES = {
    0: "raw llama.cpp (llama-batched-bench)",
    1: "fastpar C ABI",
    2: "fastpar generate_parallel",
    3: "fastpar Engine, max(8, N) client threads",
    4: "llama-server -np N, N clients",
    5: "llama-cpp-python, one at a time",
    6: "transformers generate, bf16",
    7: "fastpar generate_parallel, whole rows sampled on the host",
    8: "fastpar generate_parallel, device sampling (rows cut down on the GPU)",
    9: "fastpar Engine, every prompt submitted at once",
}
# Every level a workload defines (the plots' x-axes); --parallel and --prompt-tokens narrow
# what one run measures.
GPU_LEVELS = (1, 8, 32, 128, 256)
W2_LEVELS = (1, 2, 4, 8, 16, 32)
W2_PROMPT_TOKENS = (32, 128)
GPU_PARALLEL, W2_PARALLEL, W2_PROMPT = GPU_LEVELS, W2_LEVELS, W2_PROMPT_TOKENS


class Target:
    """Where the stages run: the CPU (default) or, with --gpu, a CUDA build with every layer offloaded."""
    gpu = False
    n_gpu_layers = 0
    baselines = BASELINES
    later_runs = 3  # on a GPU, the runs after the first on one context (n_runs())
SAMPLERS = {
    "greedy": dict(temperature=0.0, top_k=0, top_p=1.0),
    "typical": dict(temperature=0.8, top_k=40, top_p=0.95),
}


def request_params(gl: int, sampler: str) -> dict:
    """What every fastpar stage asks of a prompt: gl new tokens (ignore_eos), the sampler's
    settings, no min-p, a fixed seed."""
    return dict(max_tokens=gl, ignore_eos=True, min_p=0.0, seed=42, **SAMPLERS[sampler])


# ----------------------------------------------------------------------------- workloads

def workloads(names, default_model, speed_models):
    """(name, model, n_requests, n_parallel, prompt_tokens, gen_tokens, shared_prefix)."""
    out = []
    if "W1" in names:
        out.append(("W1", speed_models["Q4_K_M"], 40, 8, 32, 50, 0))
    if "W2" in names:
        for pl in W2_PROMPT:
            for p in W2_PARALLEL:
                out.append((f"W2-pp{pl}-np{p}", default_model, p, p, pl, 64, 0))
    if "W3" in names:
        out.append(("W3", default_model, 8, 8, 256 + 16, 64, 256))
    if "W4" in names:
        out.append(("W4", default_model, 400, 8, 64, 4, 0))
    for name in names:  # GPU: the speed model at every parallel level, 32-token prompts, 50 new tokens
        if name.startswith("G-"):
            for p in GPU_PARALLEL:
                out.append((f"{name}-np{p}", speed_models[name[2:]], p, p, 32, 50, 0))
    return out


WORDS = ("time year people way day man thing woman life child world school state family student group "
         "country problem hand part place case week company system program question work government number "
         "night point home water room mother area money story fact month lot right study book eye job word "
         "business issue side kind head house service friend father power hour game line end member law car "
         "city community name president team minute idea kid body information back parent face others level "
         "office door health person art war history party result change morning reason research girl guy").split()


def make_prompts(model: fastpar.Model, n: int, n_tokens: int, shared_prefix: int, seed: int = 0):
    """n distinct prompts of exactly n_tokens tokens each (the first shared_prefix shared)."""
    rng = random.Random(seed)

    def exact(prefix: str, want: int) -> str:
        text = prefix
        while len(model.tokenize(text)) < want:
            text += " " + rng.choice(WORDS)
        while len(model.tokenize(text)) > want:
            text = text.rsplit(" ", 1)[0]
        assert len(model.tokenize(text)) == want, (len(model.tokenize(text)), want)
        return text

    prefix = exact("", shared_prefix) if shared_prefix else ""
    return [exact(prefix + (" " if prefix else "") + rng.choice(WORDS), n_tokens) for _ in range(n)]


# ----------------------------------------------------------------------------- builds

def build_baselines(server: bool) -> dict:
    """llama.cpp's tools (llama-server only when `server`) and libfastpar, built from the same source."""
    where = Target.baselines
    names = ("llama-batched-bench", "llama-quantize") + (("llama-server",) if server else ())
    tools = {name: where / "bin" / name for name in names}
    if not all(p.exists() for p in tools.values()) or not (where / "libfastpar.so").exists():
        extra = []
        if Target.gpu:
            extra = ["-DFASTPAR_BACKEND=cuda",
                     f"-DCMAKE_CUDA_ARCHITECTURES={os.environ.get('CMAKE_CUDA_ARCHITECTURES', 'native')}"]
        subprocess.run(["cmake", "-S", str(ROOT), "-B", str(where), "-DCMAKE_BUILD_TYPE=Release",
                        "-DFASTPAR_BUILD_BASELINES=ON", "-DFASTPAR_BUILD_PYTHON=OFF", *extra], check=True)
        subprocess.run(["cmake", "--build", str(where), "-j", str(os.cpu_count()), "--target",
                        *tools, "fastpar"], check=True)
    return {k: str(v) for k, v in tools.items()}


def build_capi_bench() -> str:
    out = Target.baselines / "bench_capi"
    src = HERE / "c" / "bench_capi.c"
    lib = pathlib.Path(fastpar.get_library())
    if not out.exists() or out.stat().st_mtime < src.stat().st_mtime:
        subprocess.run(["cc", "-O2", "-std=c11", "-Wall", "-Werror", str(src), f"-I{fastpar.get_include()}", f"-L{lib.parent}",
                        "-lfastpar", f"-Wl,-rpath,{lib.parent}", "-o", str(out)], check=True)
    return str(out)


def peer_python() -> str:
    """A venv with llama-cpp-python built from the same pinned sdist as our llama.cpp."""
    py = PEER_VENV / "bin" / "python"
    if py.exists() and subprocess.run([str(py), "-c", "import llama_cpp"], capture_output=True).returncode == 0:
        return str(py)
    from fastpar._fetch import fetch_pinned  # the same pinned, checksummed artefact

    sdist = fetch_pinned("llama_cpp_python==0.3.36", SDIST,
                         "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e", sdist=True)
    subprocess.run([sys.executable, "-m", "venv", str(PEER_VENV)], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "-q", str(sdist)], check=True)
    return str(py)


# ----------------------------------------------------------------------------- stages

def n_runs() -> int:
    """How many times a stage runs its workload on one context: on a GPU once, then
    Target.later_runs more, which count (their median); the first run of a context pays
    first-use costs there (kernels loaded, CUDA graphs captured, memory pools grown), in
    raw llama.cpp's process as in a fastpar Context. On the CPU once, which counts: a first
    run costs no more there. The first run's time is kept beside (`first_wall_s`, its own
    columns), and every run's in `walls_s`."""
    return 1 + Target.later_runs if Target.gpu else 1


def counted(walls: list, r: dict) -> dict:
    """r with wall_s = the median of the runs that count (all but the first when there are
    several), first_wall_s and walls_s."""
    r["wall_s"] = statistics.median(walls[1:] if len(walls) > 1 else walls)
    r["walls_s"] = walls
    if len(walls) > 1:
        r["first_wall_s"] = walls[0]
    return r


def timed(fn):
    """Runs fn() n_runs() times -> (every run's wall seconds, the last run's result)."""
    walls = []
    for _ in range(n_runs()):
        t0 = time.perf_counter()
        out = fn()
        walls.append(time.perf_counter() - t0)
    return walls, out


def physical_batch(gpu: bool) -> str:
    """The physical batch (-b and -ub) llama.cpp's tools get: the one fastpar's Context takes
    by default (ContextParams::n_batch) on the GPU or the CPU."""
    return str(fastpar._testing.gpu_batch if gpu else fastpar._testing.cpu_batch)


def batched_bench(binary, model_path, n_par, pl, gl, runs, threads, gpu, shared=0):
    """Runs llama-batched-bench: `runs` runs of one wave (n_par sequences, pl prompt and gl
    new tokens each) in one process -> [(T_PP, T_TG, T) seconds] a run, as it prints them."""
    ub = physical_batch(gpu)
    cmd = [binary, "-m", model_path, "-c", str(n_par * (pl + gl + 16)), "-b", ub, "-ub", ub, "-npp", str(pl),
           "-ntg", str(gl), "-npl", ",".join([str(n_par)] * runs), "-t", str(threads), "-no-kvu"]
    if gpu:
        cmd += ["-ngl", "999"]
    if shared:
        cmd = [c for c in cmd if c != "-no-kvu"] + ["-pps", "-kvu"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    rows = [ln for ln in out.splitlines() if ln.startswith("|") and ln.split("|")[1].strip().isdigit()]
    if len(rows) != runs:  # a row lost from the tool's output would silently drop a run from the baseline
        raise RuntimeError(f"llama-batched-bench printed {len(rows)} result rows, asked for {runs}:\n{out}")
    return [tuple(float(row.strip("|").split("|")[k]) for k in (4, 6, 8)) for row in rows]


def stage0(tools, w, sampler, threads):
    name, model_path, n_req, n_par, pl, gl, shared = w
    # Every run in one process (one context), like every stage's (n_runs()).
    runs = batched_bench(tools["llama-batched-bench"], model_path, n_par, pl, gl, n_runs(), threads, Target.gpu, shared)
    # One wave of n_par sequences; n_req / n_par such waves take proportionally longer.
    waves = n_req / n_par
    n_prompt = (pl if shared else n_par * pl) * waves
    return counted([t * waves for _, _, t in runs], dict(n_prompt_tokens=n_prompt, n_gen_tokens=n_par * gl * waves))


def stage1(binary, w, sampler, threads, prompts, tmpdir):
    name, model_path, n_req, n_par, pl, gl, _ = w
    pfile = tmpdir / f"{name}.prompts"
    pfile.write_text("\n".join(prompts) + "\n")
    s = SAMPLERS[sampler]
    out = subprocess.run([binary, model_path, str(pfile), str(n_par), str(pl + gl + 8), str(gl), str(s["temperature"]),
                          str(s["top_k"]), str(s["top_p"]), str(threads), str(Target.n_gpu_layers), str(n_runs())],
                         capture_output=True, text=True, check=True)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    return counted(r.pop("walls_s"), r)


def stage2(models, w, sampler, threads, prompts, device_sampling=None):
    name, model_path, n_req, n_par, pl, gl, _ = w
    t0 = time.perf_counter()
    ctx = fastpar.Context(models[model_path], n_parallel=n_par, n_ctx_per_seq=pl + gl + 8, n_threads=threads,
                          **({} if device_sampling is None else dict(device_sampling=device_sampling)))
    context_s = time.perf_counter() - t0  # not in wall_s, like raw's context creation; recorded
    walls, res = timed(lambda: fastpar.generate_parallel(ctx, prompts, **request_params(gl, sampler)))
    return counted(walls, dict(n_prompt_tokens=sum(c.n_prompt_tokens for c in res),
                               n_gen_tokens=sum(c.n_gen_tokens for c in res),
                               failed=sum(c.finish_reason == "error" for c in res),
                               n_device_sampled=ctx.last_stats.n_device_sampled, context_s=context_s,
                               n_decode_calls=ctx.last_stats.n_decode_calls,
                               warmed_up=ctx.warmed_up))


def _clients(n_clients, prompts, send):
    """Feed prompts to n_clients threads calling send(prompt) -> (n_prompt, n_gen)."""
    it = iter(prompts)
    lock = threading.Lock()
    totals = [0, 0]

    def client():
        while True:
            with lock:
                p = next(it, None)
            if p is None:
                return
            a, b = send(p)
            with lock:
                totals[0] += a
                totals[1] += b

    threads = [threading.Thread(target=client) for _ in range(n_clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, totals


def engine_steps(s0, s1, n_runs: int) -> dict:
    """An Engine's decode calls a run and its time inside steps a call (EngineStats.busy_s),
    between two stats() taken around n_runs runs: a gap to generate_parallel splits into more
    calls and slower ones."""
    calls = s1.n_decode_calls - s0.n_decode_calls
    return dict(n_decode_calls=calls / n_runs, step_ms=(s1.busy_s - s0.busy_s) / max(1, calls) * 1e3)


def stage3(models, w, sampler, threads, prompts):
    name, model_path, n_req, n_par, pl, gl, _ = w
    with fastpar.Engine(models[model_path], n_parallel=n_par, n_ctx_per_seq=pl + gl + 8, n_threads=threads) as e:
        def send(p):
            c = e.submit(p, **request_params(gl, sampler)).result()
            return c.n_prompt_tokens, c.n_gen_tokens

        # 8 client threads, or one per slot where there are more slots: fewer would leave slots idle.
        s0 = e.stats()
        walls, (_, (n_prompt, n_gen)) = timed(lambda: _clients(max(8, n_par), prompts, send))
        steps = engine_steps(s0, e.stats(), len(walls))
    return counted(walls, dict(n_prompt_tokens=n_prompt, n_gen_tokens=n_gen, **steps))


def stage9(models, w, sampler, threads, prompts):
    """The Engine on generate_parallel's load: every prompt submitted at once (in a loop, so
    the first step may start before the last is in), so that a slot is refilled the step it
    frees. Stage 3's clients send a prompt only when their last is answered, which staggers
    the waves: more decode calls for the same tokens."""
    name, model_path, n_req, n_par, pl, gl, _ = w
    with fastpar.Engine(models[model_path], n_parallel=n_par, n_ctx_per_seq=pl + gl + 8, n_threads=threads,
                        max_queued=len(prompts)) as e:
        def run():
            done = [r.result() for r in [e.submit(p, **request_params(gl, sampler)) for p in prompts]]
            return sum(c.n_prompt_tokens for c in done), sum(c.n_gen_tokens for c in done)

        s0 = e.stats()
        walls, (n_prompt, n_gen) = timed(run)
        steps = engine_steps(s0, e.stats(), len(walls))
    return counted(walls, dict(n_prompt_tokens=n_prompt, n_gen_tokens=n_gen, **steps))


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def thread_cpu_s(pid: int, tid: int) -> float:
    """CPU seconds thread `tid` of process `pid` has used: utime + stime of its /proc stat (Linux)."""
    fields = pathlib.Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_healthy(port: int, proc: subprocess.Popen, what: str, timeout_s: float = 300) -> None:
    """Until the server on `port` answers /health with 200; RuntimeError if it exits first
    or takes longer than timeout_s."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with status {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{what} did not become healthy in {timeout_s:.0f} s")


class Server:
    """llama-server on a free loopback port, for one model and slot count."""

    def __init__(self, binary, model_path, n_par, n_ctx_per_seq, threads):
        ub = physical_batch(Target.gpu)
        self.port = free_port()
        self.proc = subprocess.Popen(
            [binary, "-m", model_path, "-np", str(n_par), "-c", str(n_par * n_ctx_per_seq), "-t", str(threads),
             "--host", "127.0.0.1", "--port", str(self.port), "-b", ub, "-ub", ub,
             "--no-webui", *(["-ngl", "999"] if Target.gpu else [])],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_healthy(self.port, self.proc, "llama-server", 120)
        except RuntimeError:
            self.close()
            raise

    def complete(self, prompt, n_predict, sampler):
        s = SAMPLERS[sampler]
        # Greedy asks for top_k 1: the same token (the most likely), the server's cheapest way
        # to it. With top_k 0 its chain keeps every candidate of the vocabulary for every token
        # (about 2.3 ms a token on the host with 151,936 of them, measured on the CPU build).
        top_k = s["top_k"] if s["temperature"] > 0 else 1
        body = dict(prompt=prompt, n_predict=n_predict, ignore_eos=True, cache_prompt=False, seed=42,
                    temperature=s["temperature"], top_k=top_k, top_p=s["top_p"], min_p=0.0)
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/completion", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            out = json.loads(r.read())
        return out["tokens_evaluated"], out["tokens_predicted"]

    def close(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def stage4(tools, w, sampler, threads, prompts, servers):
    """One server per workload, started on first use and shared by its repetitions and samplers."""
    name, model_path, n_req, n_par, pl, gl, _ = w
    if name not in servers:
        servers[name] = Server(tools["llama-server"], model_path, n_par, pl + gl + 8, threads)
    server = servers[name]
    walls, (_, (n_prompt, n_gen)) = timed(lambda: _clients(n_par, prompts, lambda p: server.complete(p, gl, sampler)))
    return counted(walls, dict(n_prompt_tokens=n_prompt, n_gen_tokens=n_gen))


class Transformers:
    """The PyTorch peer: transformers' batched generate on a random-initialised Qwen3-0.6B config,
    bf16, library defaults otherwise (same shape as the speed model; the weights do not matter
    for speed)."""

    def __init__(self):
        import torch
        import transformers

        self.torch = torch
        s = __import__("make_speed_model").SHAPE
        cfg = transformers.Qwen3Config(vocab_size=151936, hidden_size=s["n_embd"], intermediate_size=s["n_ff"],
                                       num_hidden_layers=s["n_layer"], num_attention_heads=s["n_head"],
                                       num_key_value_heads=s["n_head_kv"], head_dim=s["head_dim"],
                                       max_position_embeddings=s["n_ctx_train"],
                                       rms_norm_eps=s["rms_eps"], tie_word_embeddings=True,
                                       bos_token_id=None, eos_token_id=None, pad_token_id=0)
        torch.manual_seed(0)
        with torch.device("cuda"):
            self.model = transformers.Qwen3ForCausalLM(cfg).to(torch.bfloat16).eval()
        self.version = transformers.__version__
        self.run(2, 8, 4, "greedy")  # warm-up: cuBLAS handles, kernels

    def run(self, n_par, pl, gl, sampler):
        torch = self.torch
        ids = torch.randint(1000, 100000, (n_par, pl), device="cuda", generator=None)
        s = SAMPLERS[sampler]
        kw = dict(do_sample=False) if s["temperature"] == 0 else dict(
            do_sample=True, temperature=s["temperature"], top_k=s["top_k"], top_p=s["top_p"])
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=gl,
                                      min_new_tokens=gl, pad_token_id=0, **kw)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        n_gen = int(out.shape[1] - pl) * n_par
        return dict(wall_s=wall, n_prompt_tokens=n_par * pl, n_gen_tokens=n_gen)


def stage6(peer, w, sampler):
    name, model_path, n_req, n_par, pl, gl, _ = w
    out = [peer.run(n_par, pl, gl, sampler) for _ in range(n_runs())]  # each times its own generate
    return counted([r["wall_s"] for r in out], out[-1])


PEER_SCRIPT = r"""
import json, sys, time
import llama_cpp
cfg = json.loads(sys.stdin.read())
llm = llama_cpp.Llama(cfg["model"], n_ctx=cfg["n_ctx"], n_threads=cfg["threads"], n_threads_batch=cfg["threads"],
                      n_batch=512, verbose=False, seed=42)
eos = llm.token_eos()
n_prompt = n_gen = 0
t0 = time.perf_counter()
for p in cfg["prompts"]:
    out = llm.create_completion(p, max_tokens=cfg["gen"], logit_bias={eos: -1e9}, min_p=0.0, **cfg["sampler"])
    n_prompt += out["usage"]["prompt_tokens"]
    n_gen += out["usage"]["completion_tokens"]
print(json.dumps(dict(wall_s=time.perf_counter() - t0, n_prompt_tokens=n_prompt, n_gen_tokens=n_gen)))
"""


def stage5(peer_py, w, sampler, threads, prompts):
    name, model_path, n_req, n_par, pl, gl, _ = w
    cfg = dict(model=model_path, n_ctx=pl + gl + 8, threads=threads, prompts=prompts, gen=gl,
               sampler=SAMPLERS[sampler])
    out = subprocess.run([peer_py, "-c", PEER_SCRIPT], input=json.dumps(cfg), capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def gpu_name() -> str:
    out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True)
    name = out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else "gpu"
    return name.replace("NVIDIA ", "").replace(" ", "-")


# ----------------------------------------------------------------------------- report

def summarise(runs, reps_asked):
    """runs: list of dicts (one a repetition) -> medians of wall, gen tok/s and total tok/s,
    with how many repetitions they are of how many the command asked for."""
    gen = statistics.median(r["n_gen_tokens"] / r["wall_s"] for r in runs)
    total = statistics.median((r["n_gen_tokens"] + r["n_prompt_tokens"]) / r["wall_s"] for r in runs)
    out = dict(gen_tok_s=gen, total_tok_s=total, wall_s=statistics.median(r["wall_s"] for r in runs),
               n_reps=len(runs), reps_asked=reps_asked)
    if all("first_wall_s" in r for r in runs):
        out["first_gen_tok_s"] = statistics.median(r["n_gen_tokens"] / r["first_wall_s"] for r in runs)
    return out


def markdown(results, stages):
    # Where the stages ran their workload several times on one context (a GPU, n_runs()),
    # the first run's numbers get two more columns.
    first_runs = any("first_gen_tok_s" in st.get("summary", {}) for r in results.values() for st in r.values())
    lines = ["| workload | sampler | stage | gen tok/s | total tok/s | ratio to stage 0 (gen) | "
             "ratio to stage 0 (total) |" + (" first run: gen tok/s | first run: ratio to stage 0's (gen) |"
                                            if first_runs else ""),
             "|---|---|---|---:|---:|---:|---:|" + ("---:|---:|" if first_runs else "")]
    for key, per_stage in results.items():
        wname, sampler = key.split("|")
        base = per_stage.get("0", {}).get("summary", {})
        for st in stages:
            s = per_stage.get(str(st), {}).get("summary")
            if not s:
                continue
            gen = f"{s['gen_tok_s'] / base['gen_tok_s']:.2f}" if base else "-"
            total = f"{s['total_tok_s'] / base['total_tok_s']:.2f}" if base else "-"
            # A command stopped part-way (out of time) leaves rows of fewer repetitions.
            short = (f" ({s['n_reps']} of {s['reps_asked']} reps)"
                     if s.get("n_reps", 0) < s.get("reps_asked", 0) else "")
            line = f"| {wname} | {sampler} | {st}: {STAGES[st]}{short} | {s['gen_tok_s']:.1f} | {s['total_tok_s']:.1f} | {gen} | {total} |"
            if first_runs:
                first = f"{s['first_gen_tok_s']:.1f}" if "first_gen_tok_s" in s else "-"
                ratio = (f"{s['first_gen_tok_s'] / base['first_gen_tok_s']:.2f}"
                         if "first_gen_tok_s" in s and "first_gen_tok_s" in base else "-")
                line += f" {first} | {ratio} |"
            lines.append(line)
    return "\n".join(lines) + "\n"


def plot(results, stages, path):
    gpu = sorted({key.split("|")[0].rsplit("-np", 1)[0] for key in results if key.startswith("G-")})
    if not gpu and not any(key.startswith("W2-") for key in results):
        return  # the plot is W2's (or the GPU's) throughput against parallel sequences
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot (pip install matplotlib)")
        return
    # One panel per (title, levels, results key for a level, log y-axis).
    if gpu:
        panels = [(f"{g[2:]} speed model, {sampler}", GPU_LEVELS,
                   lambda p, g=g, sampler=sampler: f"{g}-np{p}|{sampler}", True)
                  for g in gpu for sampler in ("greedy", "typical")]
    else:
        panels = [(f"W2: default model, {pl}-token prompts, greedy", W2_LEVELS,
                   lambda p, pl=pl: f"W2-pp{pl}-np{p}|greedy", False) for pl in W2_PROMPT_TOKENS]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.4), squeeze=False)
    for ax, (title, levels, key, log_y) in zip(axes[0], panels):
        for st in stages:
            xs, ys = [], []
            for p in levels:
                r = results.get(key(p), {}).get(str(st), {}).get("summary")
                if r:
                    xs.append(p)
                    ys.append(r["gen_tok_s"])
            if xs:
                ax.plot(xs, ys, marker="o", label=f"{st}: {STAGES[st]}")
        ax.set_xscale("log", base=2)
        if log_y:
            ax.set_yscale("log")
        ax.set_xlabel("parallel sequences")
        ax.set_ylabel("generated tokens/s")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=None,
                        help="default W1,W2,W3,W4; with --gpu G-F16,G-Q4_K_M (the speed model at parallel "
                             "1, 8, 32, 128, 256)")
    parser.add_argument("--gpu", action="store_true",
                        help="CUDA build with every layer on the GPU: baselines in build/baselines-cuda "
                             "(CMAKE_CUDA_ARCHITECTURES from the environment, default native)")
    parser.add_argument("--parallel", default=None,
                        help="parallel levels of W2 (default 1,2,4,8,16,32) and of the GPU workloads "
                             "(default 1,8,32,128,256)")
    parser.add_argument("--prompt-tokens", default=None, help="W2's prompt lengths (default 32,128)")
    parser.add_argument("--samplers", default="greedy,typical")
    parser.add_argument("--stages", default=None, help="default 0,1,2,3,4,5; with --gpu 0,1,3,4,6,7,8 (stage 2 "
                        "with the default sampling place is 8 from 8 slots, 7 below)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--later-runs", type=int, default=Target.later_runs,
                        help="on a GPU: how many runs after a context's first count (their median; default 3)")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--host-kind", default=f"{platform.machine()}-{os.cpu_count()}cpu")
    parser.add_argument("--merge", action="store_true",
                        help="add to (or replace rows of) the results file instead of starting anew")
    parser.add_argument("--out", default=None, metavar="STEM",
                        help="results file name under bench/results, without suffix (default: the host kind)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke-test the harness: one wave per workload, 8 new tokens (not for quoting)")
    args = parser.parse_args()
    if args.later_runs < 1:
        parser.error("--later-runs must be at least 1")
    Target.later_runs = args.later_runs
    if args.gpu:
        Target.gpu, Target.n_gpu_layers, Target.baselines = True, -1, ROOT / "build" / "baselines-cuda"
        if fastpar.backend() != "cuda":
            parser.error(f"--gpu needs a CUDA build of fastpar; this one is '{fastpar.backend()}'")
        if args.host_kind == parser.get_default("host_kind"):
            args.host_kind = gpu_name()
    global GPU_PARALLEL, W2_PARALLEL, W2_PROMPT
    if args.parallel:
        GPU_PARALLEL = W2_PARALLEL = tuple(int(p) for p in args.parallel.split(","))
    if args.prompt_tokens:
        W2_PROMPT = tuple(int(p) for p in args.prompt_tokens.split(","))
    args.workloads = args.workloads or ("G-F16,G-Q4_K_M" if args.gpu else "W1,W2,W3,W4")
    args.stages = args.stages or ("0,1,3,4,6,7,8" if args.gpu else "0,1,2,3,4,5")
    if args.quick:
        args.host_kind += "-quick"
    stages = [int(s) for s in args.stages.split(",")]
    samplers = args.samplers.split(",")

    tools = build_baselines(server=4 in stages)
    sys.path.insert(0, str(HERE))
    from make_speed_model import build as build_speed_model

    names = args.workloads.split(",")
    quants = ({"Q4_K_M"} if "W1" in names else set()) | {n[2:] for n in names if n.startswith("G-")}
    speed_models = {q: str(build_speed_model(tools["llama-quantize"], q)) for q in sorted(quants)}
    default_model = fastpar.default_model_path() if any(n[:2] in ("W2", "W3", "W4") for n in names) else None
    capi = build_capi_bench() if 1 in stages else None
    peer_py = peer_python() if 5 in stages else None
    peer_torch = Transformers() if 6 in stages else None
    models: dict = {}
    for w in workloads(names, default_model, speed_models):
        if w[1] not in models:
            models[w[1]] = fastpar.Model(w[1], n_gpu_layers=Target.n_gpu_layers)
    tmpdir = Target.baselines / "bench-tmp"
    tmpdir.mkdir(exist_ok=True)

    stem = HERE / "results" / (args.out or args.host_kind)
    command = "python bench/run.py " + " ".join(sys.argv[1:])
    results: dict = {}
    commands: list = []
    if args.merge and stem.with_suffix(".json").exists():
        old = json.loads(stem.with_suffix(".json").read_text())
        results, commands = old["results"], old["meta"].get("commands", [old["meta"].get("command")])
    commands.append(command)
    meta = dict(date=datetime.date.today().isoformat(), host_kind=args.host_kind, threads=args.threads,
                machine=gpu_name() if args.gpu else (platform.processor() or platform.machine()),
                fastpar=fastpar.__version__, backend=fastpar.backend(),
                transformers=peer_torch.version if peer_torch else None,
                llama_cpp="0c1e57098", reps=args.reps, later_runs=Target.later_runs if args.gpu else 0,
                stages=STAGES, commands=commands)

    def write(with_plot=True):
        stem.parent.mkdir(exist_ok=True)
        stem.with_suffix(".json").write_text(json.dumps(dict(meta=meta, results=results), indent=2) + "\n")
        table = markdown(results, sorted({int(s) for r in results.values() for s in r}))
        cmds = "\n".join(f"* `{c}`" for c in commands)
        per_rep = (f", each the median of the {Target.later_runs} runs after a context's first (n_runs())"
                   if args.gpu else "")
        stem.with_suffix(".md").write_text(f"# fastpar benchmarks, {meta['date']}, {args.host_kind}\n\n"
                                           f"Medians of the interleaved repetitions each command asks for "
                                           f"(--reps; a row of fewer says so){per_rep}. "
                                           f"Commands:\n\n{cmds}\n\n{table}")
        if with_plot:
            plot(results, stages, stem.with_suffix(".png"))
        return table

    for w in workloads(names, default_model, speed_models):
        if args.quick:
            w = (w[0], w[1], w[3], w[3], w[4], 8, w[6])
        name, model_path, n_req, n_par, pl, gl, shared = w
        prompts = make_prompts(models[model_path], n_req, pl, shared)
        servers: dict = {}
        raw: dict = {}  # stage 0 never samples: one run per repetition serves both samplers
        for sampler in samplers:
            # A rerun replaces the stages it runs. Rerunning stage 0 drops the row's older
            # stages too: a ratio to stage 0 never mixes runs. Other stages (--merge of a peer
            # alone, say) keep the row's earlier ones.
            old_row = results.get(f"{name}|{sampler}", {})
            results[f"{name}|{sampler}"] = {} if 0 in stages else {s: v for s, v in old_row.items()
                                                                   if int(s) not in stages}
        # Interleaved: every repetition runs every sampler's stages, so that drift hits every
        # stage alike, and the raw run a repetition shares between samplers is measured
        # beside both (with the samplers outside, typical's rows were divided by raw runs
        # made minutes before them, during greedy's).
        for rep in range(args.reps):
            for sampler in samplers:
                key = f"{name}|{sampler}"
                per_stage = results[key]
                # Each repetition starts one stage later, so that no stage always runs right
                # after the same other one (a stage's place in the order could cost it).
                for st in stages[rep % len(stages):] + stages[:rep % len(stages)]:
                    if st == 0:
                        if rep not in raw:
                            raw[rep] = stage0(tools, w, sampler, args.threads)
                        r = raw[rep]
                    elif st == 1:
                        r = stage1(capi, w, sampler, args.threads, prompts, tmpdir)
                    elif st == 2:
                        r = stage2(models, w, sampler, args.threads, prompts)
                    elif st == 3:
                        r = stage3(models, w, sampler, args.threads, prompts)
                    elif st == 9:
                        r = stage9(models, w, sampler, args.threads, prompts)
                    elif st == 4:
                        r = stage4(tools, w, sampler, args.threads, prompts, servers)
                    elif st == 5:
                        r = stage5(peer_py, w, sampler, args.threads, prompts)
                    elif st == 6:
                        r = stage6(peer_torch, w, sampler)
                    elif st == 7:
                        r = stage2(models, w, sampler, args.threads, prompts, device_sampling=False)
                    else:
                        r = stage2(models, w, sampler, args.threads, prompts, device_sampling=True)
                    per_stage.setdefault(str(st), {"runs": []})["runs"].append(r)
                    print(f"{key} rep {rep} stage {st}: {r['n_gen_tokens'] / r['wall_s']:.1f} gen tok/s, "
                          f"{(r['n_gen_tokens'] + r['n_prompt_tokens']) / r['wall_s']:.1f} tok/s"
                          + (f", {r['n_decode_calls']:.0f} decode calls" if "n_decode_calls" in r else "")
                          + (f", {r['step_ms']:.2f} ms a call inside steps" if "step_ms" in r else ""), flush=True)
            # After every repetition: a run stopped part-way (a time limit) keeps every whole
            # repetition it measured, and the table says how many a row has.
            for sampler in samplers:
                for st, st_result in results[f"{name}|{sampler}"].items():
                    if int(st) in stages:  # rows kept from an earlier command keep theirs
                        st_result["summary"] = summarise(st_result["runs"], args.reps)
            table = write(with_plot=rep == args.reps - 1)
        for server in servers.values():
            server.close()

    print(table)
    print(f"wrote {stem}.json/.md/.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
