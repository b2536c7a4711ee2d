"""The R package in r/: `R CMD build` and `R CMD check` against the installed Python package,
with 0 errors and 0 warnings, and its testthat suite run by the check with nothing skipped;
and its configure step's two ways of finding fastpar. Skipped when R is not installed
(.ci/run installs it from Debian's packages)."""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys
import tarfile

import pytest

import fastpar

ROOT = pathlib.Path(__file__).resolve().parent.parent
R_PACKAGE = ROOT / "r"

pytestmark = pytest.mark.skipif(shutil.which("R") is None, reason="R is not installed (.ci/run installs it)")


def r_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "FASTPAR_HOME"}
    env.update(FASTPAR_PYTHON=sys.executable, GOMP_SPINCOUNT="3000")
    env.update(extra)
    return env


def configure(tmp_path: pathlib.Path, env: dict) -> tuple[subprocess.CompletedProcess, pathlib.Path]:
    """Runs r/configure in a copy of r/ (configure writes into src/)."""
    work = tmp_path / "r"
    shutil.copytree(R_PACKAGE, work)
    proc = subprocess.run(["sh", "./configure"], cwd=work, capture_output=True, text=True, env=env)
    return proc, work


def test_configure_finds_fastpar_through_python_or_fastpar_home(tmp_path):
    lib_dir = os.path.dirname(fastpar.get_library())
    proc, work = configure(tmp_path / "python", r_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    makevars = (work / "src" / "Makevars").read_text()
    assert f"-I'{fastpar.get_include()}'" in makevars
    assert f"-L'{lib_dir}' -lfastpar -Wl,-rpath,'{lib_dir}'" in makevars
    assert f'#define FASTPAR_R_PYTHON "{sys.executable}"' in (work / "src" / "config.h").read_text()

    proc, work = configure(tmp_path / "home", r_env(FASTPAR_HOME=lib_dir, FASTPAR_PYTHON="/nonexistent/python"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"-Wl,-rpath,'{lib_dir}'" in (work / "src" / "Makevars").read_text()
    assert '#define FASTPAR_R_PYTHON ""' in (work / "src" / "config.h").read_text()

    proc, work = configure(tmp_path / "none", r_env(FASTPAR_PYTHON="/nonexistent/python"))
    assert proc.returncode != 0
    assert "fastpar.h and libfastpar not found" in proc.stderr and "FASTPAR_HOME" in proc.stderr, proc.stderr
    assert not (work / "src" / "Makevars").exists()

    proc, _ = configure(tmp_path / "badhome", r_env(FASTPAR_HOME=str(tmp_path)))
    assert proc.returncode != 0 and "FASTPAR_HOME=" in proc.stderr, proc.stderr


def test_r_cmd_check_passes_with_no_errors_or_warnings(tmp_path, model):
    from embedding_models import make_bert

    reranker = make_bert(tmp_path / "reranker.gguf", pooling="rank")
    env = r_env(FASTPAR_TEST_MODEL=model.path, FASTPAR_TEST_RERANKER=str(reranker), _R_CHECK_FORCE_SUGGESTS_="false")
    # The build knits the vignette (it runs its code on the default model); the check
    # knits it again ("re-building of vignette outputs").
    build = subprocess.run(["R", "CMD", "build", R_PACKAGE], cwd=tmp_path,
                           capture_output=True, text=True, env=env, timeout=600)
    assert build.returncode == 0, build.stdout + build.stderr
    (tarball,) = tmp_path.glob("fastpar_*.tar.gz")
    with tarfile.open(tarball) as tar:
        html = tar.extractfile("fastpar/inst/doc/getting-started.html").read().decode()
    # Its code ran: the speed section printed both timings (not the no-model note).
    assert "loop of single calls:" in html and "one call:" in html and "was not run" not in html
    # --run-donttest: the examples, which load the model and generate, run too.
    check = subprocess.run(["R", "CMD", "check", "--no-manual", "--run-donttest", tarball.name], cwd=tmp_path,
                           capture_output=True, text=True, env=env, timeout=600)
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

    # The testthat suite ran in full: nothing failed, warned or was skipped.
    rout = (tmp_path / "fastpar.Rcheck" / "tests" / "testthat.Rout").read_text()
    summary = re.findall(r"\[ FAIL (\d+) \| WARN (\d+) \| SKIP (\d+) \| PASS (\d+) \]", rout)
    assert summary, rout[-3000:]
    fail, warn, skip, passed = map(int, summary[-1])
    print(f"testthat: FAIL {fail} | WARN {warn} | SKIP {skip} | PASS {passed}")
    assert (fail, warn, skip) == (0, 0, 0), rout[-3000:]
    assert passed >= 100


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
