"""What the artefact tests (test_packaging.py, test_c_install.py) share: running a command
whose failure shows its output, examples/c/generate.c's tokens, and the same call made from
Python."""

from __future__ import annotations

import pathlib
import subprocess

import fastpar

PROMPTS = ["The capital of France is", "Water boils at"]


def run(cmd, **kwargs) -> subprocess.CompletedProcess:
    """Runs cmd; on failure the assertion shows its output."""
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kwargs)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc


def c_example_tokens(exe: pathlib.Path, model_path: str) -> list:
    """The token ids examples/c/generate.c (built as exe) prints for PROMPTS, after checking
    that its last line names this fastpar's version and backend."""
    lines = run([exe, model_path, *PROMPTS], timeout=300).stdout.splitlines()
    tokens = []
    for i, prompt in enumerate(PROMPTS):
        head = next(ln for ln in lines if ln.startswith(f"[{i}] {prompt} ("))
        tokens.append([int(t) for t in head.split("):", 1)[1].split()])
    assert lines[-1].startswith(f"fastpar {fastpar.__version__} ({fastpar.backend()}): "), lines[-1]
    return tokens


def python_greedy(model_path: str, n_parallel: int, max_tokens: int) -> list:
    """The examples' call made from Python, on the CPU as the examples run."""
    ctx = fastpar.Context(fastpar.Model(model_path), n_parallel=n_parallel, n_ctx_per_seq=512)
    results = fastpar.generate_parallel(ctx, PROMPTS, max_tokens=max_tokens, temperature=0.0)
    assert all(c.n_gen_tokens > 0 for c in results)
    return [c.token_ids for c in results]
