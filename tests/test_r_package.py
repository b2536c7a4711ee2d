"""The R package in r/: `R CMD build` and `R CMD check` with 0 errors and 0 warnings, the
package building its own libfastpar from the bundled source (scripts/bundle_r_source.py)
where no Python package is importable, its testthat suite run by the check with nothing
skipped, and the tokens of that build equal to Python's; and configure's ways of finding
fastpar. Skipped when R is not installed (.ci/run installs it from Debian's packages)."""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys
import tarfile
import time

import pytest

import fastpar
from example_runs import PROMPTS, python_greedy

ROOT = pathlib.Path(__file__).resolve().parent.parent
R_PACKAGE = ROOT / "r"

pytestmark = pytest.mark.skipif(shutil.which("R") is None, reason="R is not installed (.ci/run installs it)")


def r_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "FASTPAR_HOME"}
    env.update(FASTPAR_PYTHON=sys.executable, GOMP_SPINCOUNT="3000")
    env.update(extra)
    return env


def copy_package(dest: pathlib.Path) -> None:
    """A copy of r/ without what an install in the checkout left: the source bundle, its
    build, and configure's and the compiler's outputs."""
    shutil.copytree(R_PACKAGE, dest, ignore=shutil.ignore_patterns("tools", "Makevars", "config.h", "*.o", "*.so"))


def configure(tmp_path: pathlib.Path, env: dict, where: pathlib.Path | None = None
              ) -> tuple[subprocess.CompletedProcess, pathlib.Path]:
    """Runs r/configure in a copy of r/ (configure writes into src/), at tmp_path/r unless
    where is given; without the source bundle or build of the checkout's r/tools."""
    work = where or tmp_path / "r"
    copy_package(work)
    proc = subprocess.run(["sh", "./configure"], cwd=work, capture_output=True, text=True, env=env)
    return proc, work


def no_python_env(tmp_path: pathlib.Path, **extra) -> dict:
    """r_env() where fastpar's Python package is not importable: FASTPAR_PYTHON names no
    interpreter and PATH's python3 fails. FASTPAR_TEST_PYTHON, which only the testthat suite
    reads (its comparisons with Python), names this interpreter."""
    stub = tmp_path / "no-python-bin"
    stub.mkdir(exist_ok=True)
    for name in ("python3", "python"):
        (stub / name).write_text("#!/bin/sh\nexit 1\n")
        (stub / name).chmod(0o755)
    # This interpreter's folder after the stub: the cmake and ninja pip installed there, as in CI.
    path = os.pathsep.join([str(stub), os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    env = r_env(FASTPAR_PYTHON="/nonexistent/python", FASTPAR_TEST_PYTHON=sys.executable, PATH=path)
    env.update(extra)
    assert subprocess.run(["sh", "-c", "python3 -c 'import fastpar'"], env=env, capture_output=True).returncode != 0
    return env


def test_configure_finds_fastpar_through_python_or_fastpar_home(tmp_path):
    lib_dir = os.path.dirname(fastpar.get_library())
    proc, work = configure(tmp_path / "python", r_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "configure: fastpar from the Python package of" in proc.stdout
    makevars = (work / "src" / "Makevars").read_text()
    assert f"-I'{fastpar.get_include()}'" in makevars
    assert f"-L'{lib_dir}' -lfastpar -Wl,-rpath,'{lib_dir}'" in makevars
    assert f'#define FASTPAR_R_PYTHON "{sys.executable}"' in (work / "src" / "config.h").read_text()

    proc, work = configure(tmp_path / "home", r_env(FASTPAR_HOME=lib_dir, FASTPAR_PYTHON="/nonexistent/python"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "configure: fastpar from FASTPAR_HOME" in proc.stdout
    assert f"-Wl,-rpath,'{lib_dir}'" in (work / "src" / "Makevars").read_text()
    assert '#define FASTPAR_R_PYTHON ""' in (work / "src" / "config.h").read_text()

    # Neither, no bundled source and not in a checkout: nothing to build from.
    proc, work = configure(tmp_path / "none", no_python_env(tmp_path))
    assert proc.returncode != 0
    assert "fastpar.h and libfastpar not found, and no source to build them from" in proc.stderr, proc.stderr
    assert "FASTPAR_HOME" in proc.stderr and "bundle_r_source.py" in proc.stderr, proc.stderr
    assert not (work / "src" / "Makevars").exists()

    proc, _ = configure(tmp_path / "badhome", r_env(FASTPAR_HOME=str(tmp_path)))
    assert proc.returncode != 0 and "FASTPAR_HOME=" in proc.stderr, proc.stderr

    # Neither, in a checkout (vendor/llama.cpp filled): it builds from the checkout, with
    # CMAKE_ARGS and FASTPAR_JOBS. (A stand-in cmake records its arguments and fails.)
    checkout = tmp_path / "checkout"
    for path in ("CMakeLists.txt", "csrc/capi/fastpar.h", "vendor/llama.cpp/CMakeLists.txt"):
        (checkout / path).parent.mkdir(parents=True, exist_ok=True)
        (checkout / path).write_text("")
    fake_cmake = tmp_path / "cmake"
    # Configures, then fails to build.
    fake_cmake.write_text('#!/bin/sh\necho "$@" >> "$FAKE_CMAKE_LOG"\n[ "$1" = --build ] || exit 0\n'
                          'echo "a build that fails"\nexit 1\n')
    fake_cmake.chmod(0o755)
    env = no_python_env(tmp_path, CMAKE=str(fake_cmake), FAKE_CMAKE_LOG=str(tmp_path / "cmake-args"),
                        CMAKE_ARGS="-DGGML_CUDA=ON -DX=1", FASTPAR_JOBS="3")
    proc, work = configure(tmp_path, env, where=checkout / "r")
    assert proc.returncode != 0
    assert f"building libfastpar from the fastpar checkout {checkout}" in proc.stdout, proc.stdout
    assert "building libfastpar failed" in proc.stderr and "a build that fails" in proc.stderr, proc.stderr
    args = (tmp_path / "cmake-args").read_text()
    assert f"-S {checkout} " in args and "-DFASTPAR_BUILD_PYTHON=OFF" in args and "-DGGML_CUDA=ON -DX=1" in args, args
    assert "--target fastpar --parallel 3" in args, args
    assert not (work / "src" / "Makevars").exists()

    # Outside a checkout, the bundled source (here a stand-in) is unpacked and built.
    (tmp_path / "stand-in" / "fastpar").mkdir(parents=True)
    (tmp_path / "stand-in" / "fastpar" / "CMakeLists.txt").write_text("")
    work = tmp_path / "bundled" / "r"
    shutil.copytree(checkout / "r", work)
    subprocess.run(["tar", "-czf", work / "tools" / "fastpar-src.tar.gz", "-C", tmp_path / "stand-in", "fastpar"],
                   check=True)
    (tmp_path / "cmake-args").unlink()
    proc = subprocess.run(["sh", "./configure"], cwd=work, capture_output=True, text=True, env=env)
    assert proc.returncode != 0
    assert (work / "tools" / "fastpar" / "CMakeLists.txt").is_file()
    assert "building libfastpar from the bundled source" in proc.stdout, proc.stdout
    args = (tmp_path / "cmake-args").read_text()
    assert f"-S {work}/tools/fastpar " in args, args
    subprocess.run(["sh", "./cleanup"], cwd=work, check=True)
    assert not (work / "tools" / "fastpar").exists()


def ccache_counts() -> dict:
    proc = subprocess.run(["ccache", "--print-stats"], capture_output=True, text=True)
    return dict((k, int(v)) for k, v in (line.split("\t") for line in proc.stdout.splitlines() if "\t" in line)
                if v.isdigit()) if proc.returncode == 0 else {}


def test_r_cmd_check_passes_building_its_own_libfastpar_without_python(tmp_path, model):
    """scripts/bundle_r_source.py, R CMD build and R CMD check --run-donttest of the tarball
    where no Python package is importable: configure builds libfastpar from the bundled
    source (twice: for the build's vignette and the check; a compiler cache in CMAKE_ARGS
    makes the second cheap), the installed package loads it through its relative rpath, and
    its tokens are Python's."""
    from embedding_models import make_bert

    reranker = make_bert(tmp_path / "reranker.gguf", pooling="rank")
    work = tmp_path / "src" / "fastpar"
    copy_package(work)
    env = no_python_env(tmp_path, FASTPAR_TEST_MODEL=model.path, FASTPAR_TEST_RERANKER=str(reranker),
                        _R_CHECK_FORCE_SUGGESTS_="false", TMPDIR=str(tmp_path))
    env.pop("LD_LIBRARY_PATH", None)
    if shutil.which("ccache"):
        if "LAUNCHER" not in env.get("CMAKE_ARGS", ""):  # .ci/run sets it
            env["CMAKE_ARGS"] = " ".join(filter(None, [env.get("CMAKE_ARGS"), "-DCMAKE_C_COMPILER_LAUNCHER=ccache",
                                                       "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"]))
        # Paths under tmp_path (both builds: TMPDIR holds R CMD build's) relative in the keys,
        # the system's headers not: with base_dir / they become ../../usr/include, which
        # differs with the build folder's depth, and the two builds shared nothing.
        env["CCACHE_BASEDIR"] = str(tmp_path)
    times = {}

    def timed(step, cmd, **kwargs):
        start = time.monotonic()
        before = ccache_counts()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, **kwargs)
        times[step] = time.monotonic() - start
        after = ccache_counts()
        hits = sum(after.get(k, 0) - before.get(k, 0) for k in ("direct_cache_hit", "preprocessed_cache_hit"))
        misses = after.get("cache_miss", 0) - before.get("cache_miss", 0)
        print(f"{step}: {times[step]:.0f} s" + (f", ccache {hits} hits, {misses} misses" if after else ""))
        return proc

    bundle = timed("bundle_r_source.py", [sys.executable, ROOT / "scripts" / "bundle_r_source.py", work])
    assert bundle.returncode == 0, bundle.stdout + bundle.stderr
    # The build knits the vignette (it runs its code on the default model); the check
    # knits it again ("re-building of vignette outputs").
    build = timed("R CMD build", ["R", "CMD", "build", work], cwd=tmp_path, timeout=1800)
    assert build.returncode == 0, build.stdout + build.stderr
    (tarball,) = tmp_path.glob("fastpar_*.tar.gz")
    with tarfile.open(tarball) as tar:
        names = tar.getnames()
        html = tar.extractfile("fastpar/inst/doc/getting-started.html").read().decode()
    # The bundle travels; no build output does.
    assert "fastpar/tools/fastpar-src.tar.gz" in names
    assert not [n for n in names if n.startswith("fastpar/tools/fastpar/")]
    # Its code ran: the speed section printed both timings (not the no-model note).
    assert "loop of single calls:" in html and "one call:" in html and "was not run" not in html
    # --run-donttest: the examples, which load the model and generate, run too.
    check = timed("R CMD check", ["R", "CMD", "check", "--no-manual", "--run-donttest", tarball.name],
                  cwd=tmp_path, timeout=1800)
    out = check.stdout + check.stderr
    status = re.search(r"^Status: (.*)$", out, re.M)
    assert status is not None, out
    notes = re.findall(r"^\* checking (.*) \.\.\. NOTE\n((?:(?!\* ).*\n)*)", check.stdout, re.M)
    print(f"R CMD check: Status: {status.group(1)}")
    for what, detail in notes:
        print(f"NOTE: checking {what}:\n{detail.rstrip()}")
    assert "ERROR" not in status.group(1) and "WARNING" not in status.group(1), out
    assert check.returncode == 0, out
    assert re.search(r"^\* checking re-building of vignette outputs \.\.\. OK$", check.stdout, re.M), out
    rcheck = tmp_path / "fastpar.Rcheck"
    install_log = (rcheck / "00install.out").read_text()
    assert "configure: no installed fastpar found: building libfastpar from the bundled source" in install_log, \
        install_log
    print(*(line for line in install_log.splitlines() if line.startswith("configure: built")), sep="\n")

    # The testthat suite ran in full: nothing failed, warned or was skipped.
    rout = (rcheck / "tests" / "testthat.Rout").read_text()
    summary = re.findall(r"\[ FAIL (\d+) \| WARN (\d+) \| SKIP (\d+) \| PASS (\d+) \]", rout)
    assert summary, rout[-3000:]
    fail, warn, skip, passed = map(int, summary[-1])
    print(f"testthat: FAIL {fail} | WARN {warn} | SKIP {skip} | PASS {passed}")
    assert (fail, warn, skip) == (0, 0, 0), rout[-3000:]
    assert passed >= 100

    # The installed package carries libfastpar and finds it through a relative rpath.
    installed = rcheck / "fastpar"
    so = installed / "libs" / "fastpar.so"
    assert (installed / "lib" / "libfastpar.so").is_file() and (installed / "include" / "fastpar.h").is_file()
    dynamic = subprocess.run(["readelf", "-d", so], capture_output=True, text=True, check=True).stdout
    assert re.search(r"R(UN)?PATH.*\[\$ORIGIN/\.\./lib\]", dynamic), dynamic
    ldd = subprocess.run(["ldd", so], capture_output=True, text=True, env=env, check=True).stdout
    assert "not found" not in ldd and f"{installed}/libs/../lib/libfastpar.so" in ldd, ldd

    # Greedy tokens of that build (loaded with no LD_LIBRARY_PATH) are Python's.
    script = ("library(fastpar)\n"
              "model <- fastpar_model(Sys.getenv('FASTPAR_TEST_MODEL'))\n"
              "ctx <- fastpar_context(model, n_parallel = 2, n_ctx_per_seq = 512)\n"
              "a <- commandArgs(TRUE)\n"
              "res <- generate_parallel(ctx, a, max_tokens = 48, temperature = 0)\n"
              "for (t in res$token_ids) cat('TOKENS', t, '\\n')\n"
              "cat('LIBRARY', fastpar_info()$library, '\\n')\n")
    r = subprocess.run(["Rscript", "-e", script, *PROMPTS], capture_output=True, text=True, timeout=300,
                       env=dict(env, R_LIBS=str(rcheck)))
    assert r.returncode == 0, r.stdout + r.stderr
    tokens = [[int(t) for t in line.split()[1:]] for line in r.stdout.splitlines() if line.startswith("TOKENS")]
    assert tokens == python_greedy(model.path, n_parallel=2, max_tokens=48)
    assert f"LIBRARY {installed}/lib/libfastpar.so" in r.stdout, r.stdout


def test_r_help_pages_and_namespace_are_roxygen2s_output(tmp_path):
    """man/ and NAMESPACE are generated from the roxygen comments in R/ and committed: they
    must be what roxygen2 makes of the comments now."""
    if subprocess.run(["Rscript", "-e", "library(roxygen2)"], capture_output=True).returncode != 0:
        pytest.skip("roxygen2 is not installed (.ci/run installs r-cran-roxygen2)")
    work = tmp_path / "r"
    shutil.copytree(R_PACKAGE, work)
    shutil.rmtree(work / "man")
    (work / "NAMESPACE").unlink()
    run = subprocess.run(["Rscript", "-e", "roxygen2::roxygenise('.', load_code = roxygen2::load_source)"],
                         cwd=work, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    for path in sorted([*(R_PACKAGE / "man").iterdir(), R_PACKAGE / "NAMESPACE"]):
        made = work / path.relative_to(R_PACKAGE)
        assert made.exists(), f"{path.name} is not made by roxygen2 any more"
        assert made.read_text() == path.read_text(), f"{path.name} differs from roxygen2's: run roxygenise"
    assert sorted(p.name for p in (work / "man").iterdir()) == sorted(p.name for p in (R_PACKAGE / "man").iterdir())
