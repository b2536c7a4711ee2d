#!/usr/bin/env python3
"""Where `fastpar serve`'s time goes under bench_server.py's HTTP load: one Engine, served
over HTTP (the server's app under uvicorn on a thread of this process, as the test suite
runs it) and loaded in-process, taking turns. For each load: generated tokens/s, time to
first token, the share of the time the engine had a request in a slot (`EngineStats.busy_s`),
its time per decode call while busy; CPU time (in cores) of the event loop's thread, the
whole process, the rest of the machine (the client processes, the kernel) and the whole
machine; and the engine's thread's CPU, its time waiting on a run queue (CPU it wanted and
did not get) and its context switches (from /proc; Linux only), all from the load's start
signal to its last answer.

    python bench/bench_server_threads.py --gpu [--users 64,256] [--reps 2] [--stream-interval 1] [--client raw]
    python bench/bench_server_threads.py          # the CPU: the tiny model of bench_wakeups.py

The HTTP load comes from --client-procs processes of the async openai client (--client raw:
bench_server.py's raw_stream, far lighter on the cores), each request streamed with
ignore_eos (bench_server.py's clients). Needs `pip install 'fastpar[server]' openai`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import statistics
import subprocess
import sys
import threading
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import fastpar  # noqa: E402
import bench_server as bs  # noqa: E402
import run as bench_run  # noqa: E402
from bench_wakeups import tiny_model  # noqa: E402
from fastpar.server.protocol import SERVE_PREFIX_CACHE_MIB  # noqa: E402


def process_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def machine_busy_s() -> float:
    """CPU seconds every core of the machine has spent busy (/proc/stat: all but idle and iowait)."""
    f = [int(x) for x in pathlib.Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(f) - f[3] - f[4]) / os.sysconf("SC_CLK_TCK")


def threads_sched() -> dict:
    """Per thread of this process: CPU seconds, seconds waiting on a run queue (schedstat; 0
    where the kernel keeps none), voluntary and involuntary context switches."""
    out = {}
    for task in pathlib.Path(f"/proc/{os.getpid()}/task").iterdir():
        try:
            tid = int(task.name)
            sched = (task / "schedstat").read_text().split()
            status = dict(line.split(":", 1) for line in (task / "status").read_text().splitlines() if ":" in line)
            out[tid] = (bench_run.thread_cpu_s(os.getpid(), tid), int(sched[1]) / 1e9,
                        int(status["voluntary_ctxt_switches"]), int(status["nonvoluntary_ctxt_switches"]))
        except (OSError, ValueError, KeyError, IndexError):
            continue  # a thread that ended meanwhile
    return out


def measure(engine: fastpar.Engine, loop_tid: int, load) -> dict:
    """Runs load(on_start, on_end), which calls the two around its measured window (for the
    HTTP load: from the start signal to the last answer, the client processes' start-up out)."""
    marks: dict = {}

    def snapshot(key: str) -> None:
        marks[key] = (engine.stats(), process_cpu_s(), machine_busy_s(), threads_sched(), time.monotonic())

    r = load(lambda: snapshot("start"), lambda: snapshot("end"))
    (s0, p0, m0, th0, t0), (s1, p1, m1, th1, t1) = marks["start"], marks["end"]
    wall = t1 - t0
    calls = s1.n_decode_calls - s0.n_decode_calls
    busy = s1.busy_s - s0.busy_s
    # The engine's thread: the busiest one besides the loop's (in-process it spins on the GPU).
    d = {tid: tuple(b - a for a, b in zip(th0[tid], th1[tid])) for tid in th1 if tid in th0 and tid != loop_tid}
    eng = max(d.values(), key=lambda v: v[0])
    loop_cpu = th1[loop_tid][0] - th0[loop_tid][0]
    return dict(tok_s=r["gen"] / r["wall"], ttft=bs.percentile(r["ttfts"], 0.5), busy=busy / wall,
                ms_call=busy / max(1, calls) * 1e3, loop=loop_cpu / wall, process=(p1 - p0) / wall,
                outside=(m1 - m0 - (p1 - p0)) / wall, machine=(m1 - m0) / wall,
                eng_cpu=eng[0] / wall, eng_wait=eng[1] / wall, eng_vol=eng[2] / wall, eng_invol=eng[3] / wall)


def main() -> int:
    import uvicorn

    from fastpar.server import create_app

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", action="store_true", help="the F16 speed model, every layer on the GPU")
    ap.add_argument("--users", default="64,256")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--client-procs", type=int, default=8)
    ap.add_argument("--stream-interval", type=int, default=1)
    ap.add_argument("--client", choices=("openai", "raw"), default="openai",
                    help="bench_server.py's clients: the openai package or raw (far lighter on the cores)")
    args = ap.parse_args()
    ngl = -1 if args.gpu else 0
    if args.gpu:
        path = subprocess.run([sys.executable, str(HERE / "make_speed_model.py"), "--type", "F16"], check=True,
                              capture_output=True, text=True).stdout.strip().splitlines()[-1]
    else:
        path = str(tiny_model())
    model = fastpar.Model(path, n_gpu_layers=ngl)
    print(f"{'GPU ' + bench_run.gpu_name() if args.gpu else 'CPU'}, {pathlib.Path(path).name}, "
          f"--stream-interval {args.stream_interval}, {args.client_procs} client processes ({args.client} client)", flush=True)
    print("| users | load | gen tok/s | TTFT p50 ms | engine busy | ms per decode call | loop thread CPU | process CPU "
          "| CPU outside the process | machine CPU | engine thread CPU | its run-queue wait | its switches/s: voluntary, "
          "involuntary |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for users in (int(u) for u in args.users.split(",")):
        def prompts(seed: int) -> list:
            if args.gpu:
                return bench_run.make_prompts(model, users * 8, 32, 0, seed=seed)
            return [f"Tell me a story about the number {seed * 100000 + k}." for k in range(users * 8)]

        with fastpar.Engine(model, n_parallel=users, n_ctx_per_seq=90, n_threads=4 if args.gpu else 1,
                            prefix_cache_mib=SERVE_PREFIX_CACHE_MIB) as engine:
            server = uvicorn.Server(uvicorn.Config(create_app(engine, stream_interval=args.stream_interval),
                                                   host="127.0.0.1", port=bench_run.free_port(),
                                                   log_level="warning", access_log=False))
            tid: list = []
            thread = threading.Thread(target=lambda: (tid.append(threading.get_native_id()), server.run()),
                                      daemon=True)
            thread.start()
            while not server.started:
                if not thread.is_alive():
                    raise RuntimeError("the server's thread ended before it started")
                time.sleep(0.05)
            url = f"http://127.0.0.1:{server.config.port}/v1"
            bs.http_load(url, [dict(prompt=p, gen=50) for p in prompts(99)[:users]], users, args.client_procs, args.client)
            rows: dict = {"HTTP": [], "in-process": []}
            for rep in range(args.reps):
                reqs = [dict(prompt=p, gen=50) for p in prompts(rep)]
                order = ["HTTP", "in-process"][::-1 if rep % 2 else 1]
                for who in order:
                    load = ((lambda start, end: bs.http_load(url, reqs, users, args.client_procs, args.client,
                                                             on_start=start, on_end=end)) if who == "HTTP"
                            else (lambda start, end: (start(), asyncio.run(bs.engine_load(engine, reqs, users)),
                                                      end())[1]))
                    rows[who].append(measure(engine, tid[0], load))
            server.should_exit = True
            thread.join(30)
        for who, rs in rows.items():
            med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
            print(f"| {users} | {who} | {med['tok_s']:,.0f} | {med['ttft'] * 1e3:.0f} | {med['busy']:.2f} | "
                  f"{med['ms_call']:.2f} | {med['loop']:.2f} | {med['process']:.2f} | {med['outside']:.2f} | "
                  f"{med['machine']:.2f} | {med['eng_cpu']:.2f} | {med['eng_wait']:.2f} | "
                  f"{med['eng_vol']:,.0f}, {med['eng_invol']:,.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
