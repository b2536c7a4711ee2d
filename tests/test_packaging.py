"""Artefacts, not the source tree: an sdist built from a fresh clone carries the pinned
llama.cpp and builds a wheel with downloads made impossible; that wheel is repaired to a
manylinux tag and works from a fresh virtual environment, and the C example and the R package
build against it the way their docs say and give the same tokens as Python.

The sdist is built from a fresh ``git clone`` of this checkout, so it sees the committed
state only (commit before running this). Building it fills vendor/llama.cpp/ the way a
user's first build does: with an empty fastpar cache, the pinned llama_cpp_python sdist
is downloaded with pip (pip's own HTTP cache may answer) and verified. Marked ``packaging``:
it builds fastpar from scratch (minutes); skip it locally with ``-m "not packaging"``.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile
import types

import pytest

import fastpar
from example_runs import PROMPTS, c_example_tokens, python_greedy, run
from llama_tools import vendor_script

pytestmark = pytest.mark.packaging

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
# What an sdist must carry to build fastpar without fetching anything.
SDIST_NEEDS = ("pyproject.toml", "LICENSE", "CMakeLists.txt", "build_backend/backend.py", "scripts/vendor_llama.py",
               *(f"scripts/llama-patches/{p.name}" for p in vendor_script().PATCHES),
               "csrc/capi/fastpar.h", "vendor/llama.cpp/CMakeLists.txt", "vendor/llama.cpp/include/llama.h",
               "vendor/llama.cpp/FASTPAR_VENDORED", "vendor/llama.cpp/ggml/src/ggml.c")


def fresh_clone(dest: pathlib.Path) -> pathlib.Path:
    """A `git clone` of this checkout's HEAD at dest, with vendor/llama.cpp/ absent (git-ignored)."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs git and a git checkout: the sdist is built from a fresh clone")
    run(["git", "clone", "--quiet", ROOT, dest])
    assert not (dest / "vendor" / "llama.cpp").exists()
    return dest


def offline_env(tmp: pathlib.Path) -> dict:
    """The environment of a build that cannot download: no package index, proxies that refuse
    every connection, an empty fastpar cache and a llama.cpp sdist that does not exist."""
    env = dict(os.environ, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1",
               FASTPAR_CACHE=str(tmp / "empty-cache"), FASTPAR_LLAMA_SDIST=str(tmp / "missing.tar.gz"))
    for var in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        env[var] = "http://127.0.0.1:9"
    for var in ("no_proxy", "NO_PROXY"):
        env.pop(var, None)
    return env


def no_network() -> list:
    """A command prefix that runs its command without any network (a new, empty network
    namespace) where the system allows it; offline_env() stands alone otherwise."""
    probe = ["unshare", "--map-root-user", "--net", "true"]
    if shutil.which("unshare") and subprocess.run(probe, capture_output=True).returncode == 0:
        return probe[:-1]
    return []


@pytest.fixture(scope="session")
def sdist(tmp_path_factory):
    """The sdist `python -m build --sdist` makes in a fresh clone (isolated, as a user runs it),
    with an empty fastpar cache, so that the build downloads the pinned llama.cpp source."""
    tmp = tmp_path_factory.mktemp("sdist")
    clone = fresh_clone(tmp / "clone")
    env = {k: v for k, v in os.environ.items() if k != "FASTPAR_LLAMA_SDIST"}
    env["FASTPAR_CACHE"] = str(tmp / "cache")
    build = run([sys.executable, "-m", "build", "--sdist", "-o", tmp / "dist", clone], env=env)
    assert "fastpar: downloading llama_cpp_python-" in build.stdout + build.stderr
    (path,) = (tmp / "dist").glob("fastpar-*.tar.gz")
    return path


@pytest.fixture(scope="session")
def wheel_env(sdist, tmp_path_factory):
    """The wheel built from the sdist with downloads made impossible, repaired by auditwheel
    and installed into a fresh virtual environment without build tools. Built once per session."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the manylinux repair (auditwheel) is Linux-only")
    tmp = tmp_path_factory.mktemp("wheel")
    with tarfile.open(sdist) as tar:
        kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(tmp / "src", **kwargs)
    (src,) = (tmp / "src").iterdir()
    build = run([*no_network(), sys.executable, "-m", "pip", "wheel", "-v", "--no-build-isolation", "--no-deps",
                 "--no-index", "-w", tmp / "dist", src], env=offline_env(tmp))
    # The build backend and CMake both found llama.cpp in place; neither tried to fetch it.
    assert "vendor_llama: vendor/llama.cpp already holds commit" in build.stdout + build.stderr
    assert "fetching the pinned source" not in build.stdout + build.stderr
    (built,) = (tmp / "dist").glob("fastpar-*.whl")
    # The native build's CPU code may use the build machine's instruction-set extensions;
    # the distributed wheel is built with FASTPAR_PORTABLE (docs/design.md, "Build and vendoring").
    run([sys.executable, "-m", "auditwheel", "repair", "--disable-isa-ext-check", "-w", tmp / "repaired", built])
    (wheel,) = (tmp / "repaired").glob("fastpar-*.whl")
    assert "manylinux" in wheel.name, wheel.name
    venv = tmp / "venv"
    run([sys.executable, "-m", "venv", venv])
    python = venv / "bin" / "python"
    # No compiler: any attempt to build something from source would fail.
    env = dict(os.environ, CC="false", CXX="false", PIP_DISABLE_PIP_VERSION_CHECK="1")
    run([python, "-m", "pip", "install", "-q", "--only-binary", ":all:", wheel], env=env, cwd=tmp)
    where = run([python, "-c", "import fastpar, json; print(json.dumps({'file': fastpar.__file__, "
                 "'include': fastpar.get_include(), 'library': fastpar.get_library(), "
                 "'version': fastpar.__version__}))"], cwd=tmp)
    info = json.loads(where.stdout)
    assert pathlib.Path(info["file"]).is_relative_to(venv), info
    return types.SimpleNamespace(python=python, wheel=wheel, tmp=tmp, **info)


def test_sdist_from_a_fresh_clone_carries_llama_cpp_and_no_bench_results(sdist):
    with tarfile.open(sdist) as tar:
        names = tar.getnames()
        top = names[0].split("/")[0]
        for need in SDIST_NEEDS:
            assert f"{top}/{need}" in names, need
        marker = tar.extractfile(f"{top}/vendor/llama.cpp/FASTPAR_VENDORED").read().decode()
    assert marker.startswith("llama.cpp commit "), marker
    for left_out in ("build/", "bench/results/", ".ci/", "vendor/llama.cpp/models/", "vendor/llama.cpp.partial/"):
        assert not any(n.startswith(f"{top}/{left_out}") for n in names), left_out
    n_llama = sum(n.startswith(f"{top}/vendor/llama.cpp/") for n in names)
    print(f"sdist {sdist.name}: {sdist.stat().st_size / 1e6:.1f} MB, {len(names)} entries, "
          f"{n_llama} under vendor/llama.cpp")


def test_sdist_build_that_cannot_fetch_llama_cpp_stops_with_a_message(tmp_path):
    clone = fresh_clone(tmp_path / "clone")
    proc = subprocess.run([*no_network(), sys.executable, "-m", "build", "--sdist", "--no-isolation",
                           "-o", tmp_path / "dist", clone], capture_output=True, text=True, env=offline_env(tmp_path))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "the pinned llama.cpp is needed in vendor/llama.cpp/" in out, out
    assert "FASTPAR_LLAMA_SDIST" in out, out
    assert not list((tmp_path / "dist").glob("*.tar.gz"))


def test_wheel_runs_the_demo_outside_the_source_tree(wheel_env, model):
    demo = run([wheel_env.python, "-m", "fastpar", "demo", "--max-tokens", "8"], cwd=wheel_env.tmp, timeout=600)
    assert demo.stdout.startswith(f"fastpar {fastpar.__version__} (")
    assert "stats:" in demo.stdout
    print(f"wheel {wheel_env.wheel.name}: {wheel_env.wheel.stat().st_size / 1e6:.1f} MB")


def test_c_example_builds_against_the_wheel_and_matches_python(wheel_env, model, tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    lib = os.path.dirname(wheel_env.library)
    exe = tmp_path / "generate"
    # examples/c/README.md's command.
    run([cc, "-std=c11", "-O2", "-Wall", "-Werror", EXAMPLES / "c" / "generate.c", f"-I{wheel_env.include}",
         f"-L{lib}", "-lfastpar", f"-Wl,-rpath,{lib}", "-o", exe])
    assert c_example_tokens(exe, model.path) == python_greedy(model.path, n_parallel=2, max_tokens=48)


@pytest.fixture(scope="module")
def r_library(wheel_env, tmp_path_factory):
    """The R package (r/) installed with `R CMD INSTALL` into a fresh library, its configure
    step finding fastpar through the wheel's Python (docs/api.md, "R")."""
    if shutil.which("Rscript") is None or shutil.which("R") is None:
        pytest.skip("R is not installed (.ci/run installs Debian's r-base-core)")
    lib = tmp_path_factory.mktemp("rlib")
    env = dict(os.environ, FASTPAR_PYTHON=str(wheel_env.python))
    env.pop("FASTPAR_HOME", None)
    src = tmp_path_factory.mktemp("rsrc") / "r"
    shutil.copytree(ROOT / "r", src)  # R CMD INSTALL builds in the folder it is given
    out = run(["R", "CMD", "INSTALL", f"--library={lib}", src], env=env, cwd=lib, timeout=600)
    assert f"fastpar from the Python package of {wheel_env.python}" in out.stdout + out.stderr
    return lib


def test_r_package_installs_against_the_wheel_and_matches_python(r_library, model, tmp_path):
    script = tmp_path / "greedy.R"
    prompts = "c(" + ", ".join(json.dumps(p) for p in PROMPTS) + ")"
    script.write_text(f"""
library(fastpar, lib.loc = {json.dumps(str(r_library))})
model <- fastpar_model({json.dumps(model.path)})
ctx <- fastpar_context(model, n_parallel = 4, n_ctx_per_seq = 512)
res <- generate_parallel(ctx, {prompts}, max_tokens = 24, temperature = 0)
for (ids in res$token_ids) cat("TOKENS", ids, "\\n")
cat("fastpar", fastpar_info()$version, "\\n")
e <- tryCatch(fastpar_model("/no/such/model.gguf"), fastpar_error = function(e) e$status)
cat("MISSING", e, "\\n")
""")
    out = run(["Rscript", script], timeout=300).stdout
    r_tokens = [[int(t) for t in ln.split()[1:]] for ln in out.splitlines() if ln.startswith("TOKENS")]
    assert f"fastpar {fastpar.__version__} " in out
    assert "MISSING not_found" in out
    assert r_tokens == python_greedy(model.path, n_parallel=4, max_tokens=24)
