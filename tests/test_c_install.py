"""The C library installed like a C library (README, "C"): `cmake --install` of a plain
CMake build gives libfastpar, fastpar.h, a CMake package and fastpar.pc, and examples/c
builds against the prefix with find_package and with pkg-config, and gives Python's tokens.

The build is tests/llama_tools.py's tree (build/baselines, without Python), which the
scoring tests' llama.cpp tools share; only libfastpar's target is built there. Marked
``packaging`` (minutes when that tree is new); skip it locally with ``-m "not packaging"``.
"""

from __future__ import annotations

import os
import pathlib
import shutil

import pytest

import fastpar
from example_runs import c_example_tokens, python_greedy, run
from llama_tools import build_target

pytestmark = pytest.mark.packaging

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "c"


@pytest.fixture(scope="module")
def prefix(tmp_path_factory) -> pathlib.Path:
    where = build_target("fastpar")
    dest = tmp_path_factory.mktemp("prefix")
    run(["cmake", "--install", where, "--prefix", dest])
    return dest


@pytest.fixture(scope="module")
def python_tokens() -> list:
    # generate.c's call: greedy, 48 new tokens, a slot per prompt.
    return python_greedy(fastpar.default_model_path(), n_parallel=2, max_tokens=48)


def test_install_holds_the_library_header_cmake_package_and_pkg_config_file(prefix):
    lib = next(prefix.glob("lib*/libfastpar.so"))
    libdir = lib.parent.name
    for path in ("include/fastpar.h", f"{libdir}/cmake/fastpar/fastparConfig.cmake",
                 f"{libdir}/cmake/fastpar/fastparConfigVersion.cmake", f"{libdir}/pkgconfig/fastpar.pc",
                 "share/doc/fastpar/LICENSE.llama.cpp"):
        assert (prefix / path).is_file(), path
    # Only fastpar's files: llama.cpp's own install rules stay out of it.
    assert not list(prefix.rglob("llama.h")) and not list(prefix.rglob("libllama*"))


def test_example_builds_with_find_package_and_matches_python(prefix, python_tokens, tmp_path):
    build = tmp_path / "build"
    run(["cmake", "-S", EXAMPLE, "-B", build, f"-DCMAKE_PREFIX_PATH={prefix}", "-DCMAKE_BUILD_TYPE=Release"])
    run(["cmake", "--build", build])
    assert c_example_tokens(build / "generate", fastpar.default_model_path()) == python_tokens


def test_example_builds_with_pkg_config_and_matches_python(prefix, python_tokens, tmp_path):
    pkg_config = shutil.which("pkg-config") or shutil.which("pkgconf")
    assert pkg_config, "pkg-config is needed (.ci/run installs it)"
    cc = shutil.which("cc") or shutil.which("gcc")
    env = dict(os.environ, PKG_CONFIG_PATH=str(next(prefix.glob("lib*/pkgconfig"))))
    flags = run([pkg_config, "--cflags", "--libs", "fastpar"], env=env).stdout.split()
    libdir = run([pkg_config, "--variable=libdir", "fastpar"], env=env).stdout.strip()
    exe = tmp_path / "generate"
    # examples/c/README.md's command.
    run([cc, "-std=c11", "-O2", "-Wall", "-Werror", EXAMPLE / "generate.c", *flags, f"-Wl,-rpath,{libdir}", "-o", exe])
    assert c_example_tokens(exe, fastpar.default_model_path()) == python_tokens
