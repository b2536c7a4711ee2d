"""fastpar's build backend: scikit-build-core's, with the pinned llama.cpp filled in first.

vendor/llama.cpp/ is not in git (third-party source; scripts/vendor_llama.py fetches it
from a pinned, checksummed sdist). An sdist made from a fresh clone must still carry it,
so that installing the sdist downloads nothing: every build hook here runs
scripts/vendor_llama.py before handing over to scikit-build-core, and stops with a
message if llama.cpp cannot be had. In an unpacked fastpar sdist, or a checkout that was
built before, the script finds llama.cpp in place and does nothing.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import subprocess
import sys

from scikit_build_core import build as _skbuild
from scikit_build_core.build import *  # noqa: F403  (the hooks this module does not wrap)

ROOT = pathlib.Path(__file__).resolve().parent.parent
VENDOR_SCRIPT = ROOT / "scripts" / "vendor_llama.py"
LLAMA_CMAKELISTS = ROOT / "vendor" / "llama.cpp" / "CMakeLists.txt"
LLAMA_MARKER = ROOT / "vendor" / "llama.cpp" / "FASTPAR_VENDORED"


def _vendored() -> bool:
    """Whether vendor/llama.cpp/ already holds the pin scripts/vendor_llama.py asks for."""
    spec = importlib.util.spec_from_file_location("_fastpar_vendor_llama", VENDOR_SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)  # constants and functions only; main() is not run
    return (LLAMA_CMAKELISTS.is_file() and LLAMA_MARKER.is_file()
            and LLAMA_MARKER.read_text() == script.MARKER_TEXT)


def _extra_requires() -> list[str]:
    # vendor_llama.py downloads with `python -m pip download`; an isolated build
    # environment (python -m build) may come without pip, so ask for it then.
    if _vendored() or os.environ.get("FASTPAR_LLAMA_SDIST") or importlib.util.find_spec("pip"):
        return []
    return ["pip"]


def _fill_vendor() -> None:
    proc = subprocess.run([sys.executable, str(VENDOR_SCRIPT)], cwd=ROOT, stdout=sys.stderr)
    if proc.returncode != 0 or not LLAMA_CMAKELISTS.is_file():
        raise SystemExit(
            "fastpar: the pinned llama.cpp is needed in vendor/llama.cpp/ to build fastpar, and "
            f"scripts/vendor_llama.py could not fill it (exit {proc.returncode}; its message is above). "
            "Either point FASTPAR_LLAMA_SDIST at a local copy of the pinned llama_cpp_python sdist "
            "(its file name and sha256 are in scripts/vendor_llama.py), or run "
            "`python scripts/vendor_llama.py` where the Python package index is reachable; then build again.")


def get_requires_for_build_sdist(config_settings=None):
    return [*_skbuild.get_requires_for_build_sdist(config_settings), *_extra_requires()]


def get_requires_for_build_wheel(config_settings=None):
    return [*_skbuild.get_requires_for_build_wheel(config_settings), *_extra_requires()]


def get_requires_for_build_editable(config_settings=None):
    return [*_skbuild.get_requires_for_build_editable(config_settings), *_extra_requires()]


def build_sdist(sdist_directory, config_settings=None):
    _fill_vendor()
    return _skbuild.build_sdist(sdist_directory, config_settings)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    _fill_vendor()
    return _skbuild.build_wheel(wheel_directory, config_settings, metadata_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    _fill_vendor()
    return _skbuild.build_editable(wheel_directory, config_settings, metadata_directory)
