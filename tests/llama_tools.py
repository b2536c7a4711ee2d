"""llama.cpp's own tools, built from the vendored source, as anchors for fastpar's numbers.

`llama_tool(name)` builds one target of the `FASTPAR_BUILD_BASELINES` configuration in
build/baselines (bench/run.py builds its baselines there too) and returns its path; an
already built tool is reused. `build_target(name)` builds any target there (libfastpar for
tests/test_c_install.py). `llama_server(model, *args)` runs llama-server while a block
lasts. With ccache on the PATH the build goes through it, so that
llama.cpp's and ggml's objects can come from the cache of an earlier build; without it
the first tool built compiles llama.cpp (minutes), the later ones only themselves.
FASTPAR_LLAMA_TOOLS names a folder that already holds the tools (a build elsewhere).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import pathlib
import shutil
import socket
import subprocess
import time
from typing import Iterator

ROOT = pathlib.Path(__file__).resolve().parents[1]
BASELINES = ROOT / "build" / "baselines"


@functools.cache
def vendor_script():
    """scripts/vendor_llama.py as a module: the pin, MARKER_TEXT and PATCHES (main() is not run)."""
    spec = importlib.util.spec_from_file_location("_vendor_llama", ROOT / "scripts" / "vendor_llama.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def llama_tool(name: str) -> str:
    given = os.environ.get("FASTPAR_LLAMA_TOOLS")
    if given:
        path = pathlib.Path(given) / name
        if not path.exists():
            raise FileNotFoundError(f"FASTPAR_LLAMA_TOOLS={given} holds no {name}")
        return str(path)
    where = build_target(name)
    return str(where / "bin" / name)


def build_target(name: str) -> pathlib.Path:
    """Builds target `name` of the baselines tree (configured on first use) and returns the tree."""
    import fastpar

    # A CUDA build of fastpar is measured against CUDA tools (as bench/run.py --gpu builds them).
    cuda = fastpar.backend() == "cuda"
    where = ROOT / "build" / "baselines-cuda" if cuda else BASELINES
    if (where / "bin" / name).exists():
        return where
    args = ["cmake", "-S", str(ROOT), "-B", str(where), "-DCMAKE_BUILD_TYPE=Release",
            "-DFASTPAR_BUILD_BASELINES=ON", "-DFASTPAR_BUILD_PYTHON=OFF"]
    if cuda:
        args += ["-DFASTPAR_BACKEND=cuda",
                 f"-DCMAKE_CUDA_ARCHITECTURES={os.environ.get('CMAKE_CUDA_ARCHITECTURES', 'native')}"]
    if shutil.which("ccache") and not (where / "CMakeCache.txt").exists():
        args += ["-DCMAKE_C_COMPILER_LAUNCHER=ccache", "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"]
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", str(where), "-j", str(os.cpu_count() or 1), "--target", name],
                   check=True, stdout=subprocess.DEVNULL)
    return where


@contextlib.contextmanager
def llama_server(model_path: str, *args: str) -> Iterator[str]:
    """llama.cpp's llama-server on `model_path` (with `args`) on a free port of this host,
    until the block ends; yields its base URL once /health answers 200."""
    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([llama_tool("llama-server"), "-m", model_path, "--host", "127.0.0.1", "--port", str(port),
                             "--no-webui", *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {proc.returncode}: {proc.stderr.read()[-2000:]}")
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("llama-server did not become healthy within 120 s")
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stderr.close()
