"""llama.cpp's OpenMP threads spin briefly before they sleep (fastpar/_openmp.py), unless
the user chose otherwise; processes started later get the environment as it was."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import fastpar
import fastpar._openmp
import pytest

# In a fresh process: the variable after import and after the first Model, what libgomp
# took (its own report of its settings), and what a child process inherits.
CHILD = """
import ctypes, ctypes.util, os, subprocess, sys
import fastpar
print("import", os.environ.get("GOMP_SPINCOUNT"))
fastpar.Model({path!r})
print("model", os.environ.get("GOMP_SPINCOUNT"))
sys.stdout.flush()
gomp = ctypes.util.find_library("gomp")
loaded = sys.platform.startswith("linux") and any("libgomp" in line for line in open("/proc/self/maps"))
print("gomp", "loaded" if gomp and loaded else "None")
sys.stdout.flush()
if gomp and loaded:
    ctypes.CDLL(gomp).omp_display_env(1)  # its settings on stderr, GOMP_SPINCOUNT = '...' among them
print("child", subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('GOMP_SPINCOUNT'))"],
                              capture_output=True, text=True).stdout.strip())
"""


def _run(**env_changes):
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    env.update(env_changes)
    out = subprocess.run([sys.executable, "-c", CHILD.format(path=fastpar.default_model_path())], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    got = {ln.split()[0]: ln.split()[1] for ln in out.stdout.splitlines()
           if ln.split() and ln.split()[0] in ("import", "model", "child", "gomp")}
    # What libgomp took, where this build uses it (a build without OpenMP has nothing to set).
    # Lines as "GOMP_SPINCOUNT = '3000'", or "[host] GOMP_SPINCOUNT = '3000'" (newer libgomp).
    taken = [m.group(1) for m in (re.match(r"(?:\[\w+\]\s*)?GOMP_SPINCOUNT\s*=\s*'?([^']*)'?", ln.strip())
                                   for ln in out.stderr.splitlines()) if m]
    assert bool(taken) == (got.pop("gomp") == "loaded"), out.stderr
    return got, taken


def test_short_spins_unless_the_user_chose():
    got, taken = _run()
    assert got == {"import": fastpar._openmp.SPIN_COUNT, "model": "None", "child": "None"}
    assert taken in ([], [fastpar._openmp.SPIN_COUNT])


@pytest.mark.parametrize("name, value", [("GOMP_SPINCOUNT", "123456"), ("OMP_WAIT_POLICY", "ACTIVE")])
def test_the_users_setting_is_kept(name, value):
    got, taken = _run(**{name: value})
    want = value if name == "GOMP_SPINCOUNT" else "None"
    assert got == {"import": want, "model": want, "child": want}
    if name == "GOMP_SPINCOUNT":
        assert taken in ([], [value])
