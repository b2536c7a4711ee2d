#!/usr/bin/env python3
"""Fill vendor/llama.cpp/ from the pinned registry sdist (see docs/design.md, "Build and vendoring").

The sdist llama_cpp_python-0.3.36.tar.gz carries llama.cpp at commit 0c1e57098 under
``vendor/llama.cpp/``. This script downloads it (or takes ``$FASTPAR_LLAMA_SDIST``),
verifies its sha256, extracts only that subtree, applies the patches in
``scripts/llama-patches/`` (each says why, what it measured and which test covers it), and
records the commit and the patches in ``vendor/llama.cpp/FASTPAR_VENDORED``. Running it again
is a no-op; a changed patch set fills the folder again.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
DEST = ROOT / "vendor" / "llama.cpp"
MARKER = DEST / "FASTPAR_VENDORED"

SDIST_REQUIREMENT = "llama_cpp_python==0.3.36"
SDIST_NAME = "llama_cpp_python-0.3.36.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
SDIST_SIZE = 76_589_250  # bytes, for the download's progress message
SUBTREE = "llama_cpp_python-0.3.36/vendor/llama.cpp/"
LLAMA_COMMIT = "0c1e57098"
PATCHES = sorted((ROOT / "scripts" / "llama-patches").glob("*.patch"))
# The first line names the commit alone: prefix-cache files are keyed by it (CMakeLists.txt).
MARKER_TEXT = (f"llama.cpp commit {LLAMA_COMMIT}\nfrom {SDIST_NAME} sha256 {SDIST_SHA256}\n"
               + "".join(f"patch {p.name} sha256 {hashlib.sha256(p.read_bytes()).hexdigest()}\n" for p in PATCHES))


def _load_fetch():
    # fastpar is not installed yet when the build runs this: load its helper by path.
    spec = importlib.util.spec_from_file_location("_fastpar_fetch", ROOT / "src" / "fastpar" / "_fetch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _sdist_path() -> pathlib.Path:
    fetch = _load_fetch()
    local = os.environ.get("FASTPAR_LLAMA_SDIST")
    if local:
        path = pathlib.Path(local)
        if not path.is_file():
            sys.exit(f"vendor_llama: FASTPAR_LLAMA_SDIST={path} is not a file")
        if fetch.sha256_of(path) != SDIST_SHA256:
            sys.exit(f"vendor_llama: {path} does not have sha256 {SDIST_SHA256}")
        return path
    return fetch.fetch_pinned(SDIST_REQUIREMENT, SDIST_NAME, SDIST_SHA256, sdist=True,
                              what="the pinned llama_cpp_python sdist, which carries llama.cpp's source",
                              size=SDIST_SIZE)


def _apply(patch: pathlib.Path, tree: pathlib.Path) -> str | None:
    """Applies one patch to tree; returns why it failed, or None."""
    if shutil.which("patch"):
        cmd = ["patch", "-p1", "-N", "-s", "-d", str(tree), "-i", str(patch)]
    elif shutil.which("git"):
        cmd = ["git", "apply", "-p1", str(patch)]
    else:
        return "applying it needs `patch` or `git`, and neither is on PATH"
    proc = subprocess.run(cmd, cwd=tree, capture_output=True, text=True)
    return None if proc.returncode == 0 else (proc.stdout + proc.stderr).strip() or f"exit {proc.returncode}"


def main() -> int:
    if MARKER.is_file() and MARKER.read_text() == MARKER_TEXT and (DEST / "CMakeLists.txt").is_file():
        print(f"vendor_llama: vendor/llama.cpp already holds commit {LLAMA_COMMIT}")
        return 0
    try:
        sdist = _sdist_path()
    except RuntimeError as err:
        print(f"vendor_llama: {err}", file=sys.stderr)
        return 1

    staging = DEST.with_name("llama.cpp.partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    with tarfile.open(sdist, "r:gz") as tar:
        for member in tar.getmembers():
            if not member.name.startswith(SUBTREE) or member.name == SUBTREE:
                continue
            rel = member.name[len(SUBTREE):]
            if member.issym() or member.islnk() or ".." in pathlib.PurePosixPath(rel).parts:
                continue  # the subtree needs no links; never follow one out of it
            member.name = rel
            if hasattr(tarfile, "data_filter"):
                tar.extract(member, staging, filter="data")
            else:  # Python without extraction filters; links and ".." are already skipped
                tar.extract(member, staging)
    if not (staging / "CMakeLists.txt").is_file():
        shutil.rmtree(staging, ignore_errors=True)
        print(f"vendor_llama: {SDIST_NAME} has no {SUBTREE}CMakeLists.txt", file=sys.stderr)
        return 1
    for patch in PATCHES:
        why = _apply(patch, staging)
        if why:
            shutil.rmtree(staging, ignore_errors=True)
            print(f"vendor_llama: scripts/llama-patches/{patch.name} does not apply: {why}", file=sys.stderr)
            return 1
    (staging / "FASTPAR_VENDORED").write_text(MARKER_TEXT)
    shutil.rmtree(DEST, ignore_errors=True)
    staging.rename(DEST)
    print(f"vendor_llama: vendor/llama.cpp now holds llama.cpp commit {LLAMA_COMMIT}"
          + (f" with {len(PATCHES)} patch(es)" if PATCHES else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
