#!/usr/bin/env python3
"""Bundles the source of fastpar's C library into the R package, so that `R CMD build r`
makes a tarball that installs offline without Python: r/configure builds libfastpar from it
when no installed fastpar is found (README, "R").

Writes r/tools/fastpar-src.tar.gz (git-ignored): what the plain CMake build of libfastpar
needs (CMakeLists.txt, cmake/, csrc/capi/, csrc/core/, the linker maps, the version file,
LICENSE) and the part of the pinned llama.cpp that pyproject.toml's sdist.include lists,
read from there. One archive rather than a folder: llama.cpp's deepest paths exceed the
100 bytes an R source tarball may hold.

    python3 scripts/bundle_r_source.py [R_PACKAGE_FOLDER]   # default: r/
"""

from __future__ import annotations

import argparse
import gzip
import io
import pathlib
import sys
import tarfile

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    sys.exit("bundle_r_source.py needs Python 3.11 or later (tomllib)")

ROOT = pathlib.Path(__file__).resolve().parent.parent
LLAMA = ROOT / "vendor" / "llama.cpp"
ARCHIVE = pathlib.Path("tools") / "fastpar-src.tar.gz"
# fastpar's own part of a build with FASTPAR_BUILD_PYTHON=OFF and FASTPAR_TESTING=OFF.
# CMakeLists.txt reads the version from _version.py and probes the linker with module.map.
OWN = ["CMakeLists.txt", "LICENSE", "cmake", "csrc/capi", "csrc/core", "csrc/python/module.map",
       "src/fastpar/_version.py"]


def llama_patterns() -> list[str]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        config = tomllib.load(f)["tool"]["scikit-build"]
    include = config.get("sdist", {}).get("include")  # the dotted key sdist.include
    if not include:
        sys.exit("bundle_r_source.py: pyproject.toml has no [tool.scikit-build] sdist.include")
    return [p for p in include if p.startswith("vendor/llama.cpp/")]


def files_of(pattern: str) -> list[pathlib.Path]:
    matches = sorted(ROOT.glob(pattern))
    if not matches:
        sys.exit(f"bundle_r_source.py: nothing matches {pattern!r}")
    out = []
    for path in matches:
        if path.is_dir():
            out += sorted(p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
        elif path.is_file():
            out.append(path)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("package", nargs="?", default=str(ROOT / "r"), help="the R package's folder (default: r/)")
    args = parser.parse_args()
    if not (LLAMA / "CMakeLists.txt").is_file() or not (LLAMA / "FASTPAR_VENDORED").is_file():
        sys.exit(f"bundle_r_source.py: {LLAMA} is not filled with the pinned llama.cpp; "
                 f"run `python3 scripts/vendor_llama.py` first")
    files: dict[str, pathlib.Path] = {}
    for pattern in OWN + llama_patterns():
        for path in files_of(pattern):
            files[path.relative_to(ROOT).as_posix()] = path

    dest = pathlib.Path(args.package) / ARCHIVE
    dest.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    # Sorted names, no owners: the same checkout gives the same archive.
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(files):
            info = tar.gettarinfo(str(files[name]), arcname=f"fastpar/{name}")
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            with open(files[name], "rb") as f:
                tar.addfile(info, f)
    with open(dest, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9, mtime=0, filename="") as gz:
        gz.write(buffer.getvalue())
    size = dest.stat().st_size / 1e6
    print(f"bundle_r_source.py: {dest}: {len(files)} files, {size:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
