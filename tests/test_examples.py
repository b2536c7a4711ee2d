"""examples/: built the way their READMEs say, against the installed package, and checked."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

import pytest

import fastpar

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def test_c_example_builds_against_the_package_and_matches_python(tmp_path, model):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    inc = fastpar.get_include()
    lib = os.path.dirname(fastpar.get_library())
    exe = tmp_path / "generate"
    subprocess.run([cc, "-std=c11", "-O2", "-Wall", "-Werror", str(EXAMPLES / "c" / "generate.c"), f"-I{inc}",
                    f"-L{lib}", "-lfastpar", f"-Wl,-rpath,{lib}", "-o", str(exe)], check=True)
    prompts = ["The capital of France is", "Water boils at"]
    run = subprocess.run([str(exe), model.path, *prompts], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    c_tokens = []
    for i, prompt in enumerate(prompts):
        head = next(ln for ln in lines if ln.startswith(f"[{i}] {prompt} ("))
        c_tokens.append([int(t) for t in head.split("):", 1)[1].split()])
    assert lines[-1].startswith(f"fastpar {fastpar.__version__} ({fastpar.backend()}): ")
    # The same call from Python, on the CPU as the example runs: the same tokens.
    cpu_model = fastpar.Model(model.path)
    ctx = fastpar.Context(cpu_model, n_parallel=2, n_ctx_per_seq=512)
    expected = fastpar.generate_parallel(ctx, prompts, max_tokens=48, temperature=0.0)
    assert c_tokens == [c.token_ids for c in expected]
    assert all(c.n_gen_tokens > 0 for c in expected)
