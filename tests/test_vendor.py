"""The vendored llama.cpp is the pinned source with exactly the patches in scripts/llama-patches/.

A patch is allowed only with its reason, its measurement and the tests that cover it (the
header above its diff), and a tree filled before a patch was added must not pass for one with it.
"""
from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest
from llama_tools import vendor_script

ROOT = pathlib.Path(__file__).resolve().parent.parent

SCRIPT = vendor_script()


def test_the_vendored_tree_holds_the_pin_and_every_patch():
    # The marker names the commit and each patch with its sha256 (vendor_llama.MARKER_TEXT).
    marker = (ROOT / "vendor" / "llama.cpp" / "FASTPAR_VENDORED").read_text()
    assert marker == SCRIPT.MARKER_TEXT, "vendor/llama.cpp is stale: run scripts/vendor_llama.py"


@pytest.mark.parametrize("patch", SCRIPT.PATCHES, ids=lambda p: p.name)
def test_each_patch_says_why_what_it_measured_and_its_tests(patch):
    header = patch.read_text().split("\n--- a/", 1)[0]
    for part in ("Why:", "Measured", "Outputs:", "Tests:"):
        assert part in header, (patch.name, part)


@pytest.mark.parametrize("patch", SCRIPT.PATCHES, ids=lambda p: p.name)
def test_each_patch_is_applied_in_the_vendored_tree(patch):
    if not shutil.which("patch"):
        pytest.skip("no `patch` on PATH to check the tree with")
    # Reversing it cleanly (without writing) means every hunk is there as the patch left it.
    proc = subprocess.run(["patch", "-p1", "-R", "--dry-run", "-s", "-f", "-d", str(ROOT / "vendor" / "llama.cpp"),
                           "-i", str(patch)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
