"""The type stubs of the native modules (src/fastpar/_core.pyi, _testing.pyi) are what
pybind11-stubgen makes of the installed modules now: a binding changed without regenerating
them fails here (docs/testing.md has the command)."""

from __future__ import annotations

import difflib
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
# The command docs/testing.md gives, writing into a temporary folder instead of src/.
STUBGEN = [sys.executable, "-m", "pybind11_stubgen", "fastpar._core", "fastpar._testing",
           "--exit-code"]


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("stubs")
    run = subprocess.run([*STUBGEN, "-o", str(out)], capture_output=True, text=True)
    assert run.returncode == 0, f"pybind11-stubgen (in the test extra) failed:\n{run.stdout}{run.stderr}"
    return out / "fastpar"


@pytest.mark.parametrize("module", ["_core", "_testing"])
def test_committed_stub_is_the_generated_one(generated, module):
    committed = ROOT / "src" / "fastpar" / f"{module}.pyi"
    made = generated / f"{module}.pyi"
    assert made.is_file(), f"pybind11-stubgen made no {module}.pyi"
    diff = "".join(difflib.unified_diff(committed.read_text().splitlines(True), made.read_text().splitlines(True),
                                        f"committed {committed.name}", f"generated {made.name}"))
    assert not diff, (f"src/fastpar/{module}.pyi is stale: regenerate it with "
                      f"`python -m pybind11_stubgen fastpar._core fastpar._testing -o src "
                      f"--exit-code` (docs/testing.md)\n{diff}")
