"""The portable wheel (FASTPAR_PORTABLE=ON) against a native build, on W1.

    FASTPAR_PORTABLE=ON python -m build --wheel -o dist-portable
    python bench/bench_portable.py dist-portable/fastpar-*.whl [--reps 3] [--threads 2]

W1 (bench/README.md): 40 requests, 8 in parallel, 32-token prompts, 50 new tokens, greedy,
the Qwen3-0.6B-shape Q4_K_M speed model (bench/make_speed_model.py, cached), through
`generate_parallel`. The native side is the fastpar installed in this Python (a source
build: -march=native); the portable side is the wheel, installed into
build/portable-venv. Each run is its own process and the two alternate; medians of --reps.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
VENV = HERE.parent / "build" / "portable-venv"


def worker(model_path: str, threads: int) -> None:
    sys.path.insert(0, str(HERE))
    import fastpar
    from run import make_prompts, stage2, workloads

    model = fastpar.Model(model_path)
    (w1,) = workloads(["W1"], None, {"Q4_K_M": model_path})
    prompts = make_prompts(model, w1[2], w1[4], w1[6])
    r = stage2({model_path: model}, w1, "greedy", threads, prompts)
    assert r["failed"] == 0
    print(json.dumps(dict(r, fastpar=fastpar.__file__, gen_tok_s=r["n_gen_tokens"] / r["wall_s"])))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("wheel", nargs="?")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--worker", metavar="MODEL")
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.threads)
        return 0
    if not args.wheel:
        ap.error("give the portable wheel")
    sys.path.insert(0, str(HERE))
    from make_speed_model import build as build_speed_model
    from run import build_baselines

    model = str(build_speed_model(build_baselines()["llama-quantize"], "Q4_K_M"))
    python = VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--force-reinstall", args.wheel], check=True)
    sides = {"native": sys.executable, "portable": str(python)}
    runs: dict = {k: [] for k in sides}
    for rep in range(args.reps):
        for name, py in sides.items():
            out = subprocess.run([py, __file__, "--worker", model, "--threads", str(args.threads)],
                                 capture_output=True, text=True, check=True, cwd=HERE.parent)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            runs[name].append(r["gen_tok_s"])
            print(f"rep {rep} {name}: {r['gen_tok_s']:.2f} gen tok/s, {r['wall_s']:.1f} s ({r['fastpar']})", flush=True)
    med = {k: statistics.median(v) for k, v in runs.items()}
    print(f"W1 generate_parallel, medians of {args.reps}: native {med['native']:.2f} gen tok/s, "
          f"portable {med['portable']:.2f}; portable / native = {med['portable'] / med['native']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
