"""fastpar beside other C++ extensions in one process, in either import order, and what the
shared objects fastpar builds export (docs/design.md, "Build and vendoring").

The other extensions: numpy, matplotlib (its Agg backend, ft2font and _path modules are
pybind11-built C++), contourpy (pybind11, matplotlib's contouring) and kiwisolver (C++,
matplotlib's layout solver). Each links the shared libstdc++, the library a fastpar that
exported a copy of the C++ runtime took the place of; matplotlib's Agg backend is what
crashed after such a fastpar.

Also a script for a GPU machine: `python tests/test_imports.py --torch` runs both orders
with PyTorch and a CUDA tensor added (and fastpar's layers on the GPU when it is a CUDA
build), one subprocess per order, and prints one line per order with its exit status.
"""

from __future__ import annotations

import pathlib
import re
import signal
import subprocess
import sys

import pytest
from conftest import N_GPU_LAYERS  # FASTPAR_TEST_N_GPU_LAYERS, as in the whole suite

PROMPTS = ["The capital of France is", "Water boils at"]
MAX_TOKENS = 4


def fastpar_code(model_path: str, n_gpu_layers: int) -> str:
    return f"""
import fastpar
model = fastpar.Model({model_path!r}, n_gpu_layers={n_gpu_layers})
ctx = fastpar.Context(model, n_parallel=2, n_ctx_per_seq=128)
out = fastpar.generate_parallel(ctx, {PROMPTS!r}, max_tokens={MAX_TOKENS}, temperature=0.0, ignore_eos=True)
assert [c.n_gen_tokens for c in out] == [{MAX_TOKENS}] * {len(PROMPTS)}, out
print("fastpar ok:", [c.text for c in out])
"""


def others_code(figure: str) -> str:
    return f"""
import numpy as np
assert np.allclose(np.linalg.solve(np.eye(3) * 2.0, np.ones(3)), 0.5)
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
x = np.linspace(0.0, 3.0, 40)
z = np.outer(np.sin(x), np.cos(x))
fig, ax = plt.subplots(figsize=(3, 2), layout="constrained")  # kiwisolver lays it out
ax.contour(x, x, z, levels=5)  # contourpy
ax.plot(x, np.sin(x))
ax.set_title("fastpar and matplotlib")  # ft2font
fig.savefig({figure!r})
plt.close(fig)
import pathlib
assert pathlib.Path({figure!r}).stat().st_size > 1000
import contourpy
assert contourpy.contour_generator(x, x, z).lines(0.25)
import kiwisolver
v = kiwisolver.Variable("v")
solver = kiwisolver.Solver()
solver.addConstraint(v == 3)
solver.updateVariables()
assert v.value() == 3
print("numpy, matplotlib, contourpy, kiwisolver ok")
"""


TORCH_CODE = """
import torch
t = torch.ones(4, device="cuda")
assert float(t.sum()) == 4.0
print("torch ok:", torch.__version__, torch.cuda.get_device_name())
"""


def run_order(first: str, second: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", first + second], capture_output=True, text=True, timeout=timeout)


def describe(proc: subprocess.CompletedProcess) -> str:
    if proc.returncode < 0:
        return f"killed by {signal.Signals(-proc.returncode).name}"
    return f"exit {proc.returncode}"


# ---------------------------------------------------------------------------
# The tests
# ---------------------------------------------------------------------------


def test_fastpar_first_then_other_cpp_extensions(model, tmp_path):
    proc = run_order(fastpar_code(model.path, N_GPU_LAYERS), others_code(str(tmp_path / "figure.png")))
    assert proc.returncode == 0, f"{describe(proc)}\n{proc.stdout}\n{proc.stderr}"
    assert "fastpar ok" in proc.stdout and "kiwisolver ok" in proc.stdout


def test_other_cpp_extensions_first_then_fastpar(model, tmp_path):
    proc = run_order(others_code(str(tmp_path / "figure.png")), fastpar_code(model.path, N_GPU_LAYERS))
    assert proc.returncode == 0, f"{describe(proc)}\n{proc.stdout}\n{proc.stderr}"
    assert "fastpar ok" in proc.stdout and "kiwisolver ok" in proc.stdout


# What may be exported. libfastpar: the C ABI fastpar.h declares and fastpar:: C++ symbols
# (by mangled name: functions, const members, vtables, typeinfo and its names, guard
# variables, statics of inline functions); a Python module: its PyInit_ function.
FASTPAR_CXX = re.compile(r"_Z(?:N|NK|TVN|TIN|TSN|GVN|ZN|ZNK)7fastpar")
# What never may: the C++ runtime (std:: by its mangled prefixes, the old-ABI std::string
# included; the ABI support library; operator new/delete; the unwinder) and llama.cpp.
RUNTIME_PROPER = r"__cxa_|__gxx_|_Zn[wa]|_Zd[la]|_ZTVN10__cxxabiv1|_Unwind_"
CXX_RUNTIME = re.compile(r"_Z(?:T[VIS]|GV|Th\w*_)?N?K?S[tabsiod]|" + RUNTIME_PROPER)
LLAMA = re.compile(r"(?:ggml|llama|gguf)_")
# The portable wheel's separate llama.cpp and ggml libraries (FASTPAR_PORTABLE): libfastpar
# and the CPU variants link them, so they export llama_/ggml_/gguf_ and the C++ of their
# own code (std:: templates it instantiates among it) by design. Of those, only what a copy
# of the C++ runtime would bring is checked: the ABI library, operator new/delete, the unwinder.
LLAMA_CPP_LIBRARY = re.compile(r"lib(?:fastpar-llama|fastpar-ggml(?:-base)?|ggml-cpu-[\w-]+)\.so")
# Defined by the linker in every shared object, not by the code.
LINKER_DEFINED = {"_init", "_fini", "_edata", "_end", "__bss_start"}


def exported_symbols(path: pathlib.Path) -> set:
    """The symbols a shared object exports: defined, global or weak, visible in .dynsym."""
    from elftools.elf.elffile import ELFFile

    names = set()
    with open(path, "rb") as f:
        dynsym = ELFFile(f).get_section_by_name(".dynsym")
        for sym in dynsym.iter_symbols() if dynsym else ():
            if (sym.name and sym["st_shndx"] != "SHN_UNDEF"
                    and sym["st_info"]["bind"] in ("STB_GLOBAL", "STB_WEAK", "STB_GNU_UNIQUE")
                    and sym["st_other"]["visibility"] in ("STV_DEFAULT", "STV_PROTECTED")):
                names.add(sym.name)
    return names - LINKER_DEFINED


def shipped_shared_objects() -> list:
    import fastpar

    # The native modules' folder: the package's, or an editable install's build output.
    here = pathlib.Path(fastpar.get_library()).parent
    return sorted(p for p in here.rglob("*") if p.is_file() and p.read_bytes()[:4] == b"\x7fELF")


def declared_c_abi() -> set:
    import fastpar

    header = (pathlib.Path(fastpar.get_include()) / "fastpar.h").read_text()
    return set(re.findall(r"^FASTPAR_API\b[^;]*?\b(fastpar_\w+)\s*\(", header, re.M))


def export_problems() -> list:
    """One line per shipped shared object that exports more than its interface."""
    c_abi = declared_c_abi()
    assert {"fastpar_version", "fastpar_model_load", "fastpar_generate_parallel"} <= c_abi, c_abi
    objects = shipped_shared_objects()
    names = [p.name for p in objects]
    assert any(n == "libfastpar.so" for n in names), names
    assert any(n.startswith("_core.") for n in names), names
    problems = []
    for path in objects:
        exported = exported_symbols(path)
        if LLAMA_CPP_LIBRARY.fullmatch(path.name):
            allowed = {s for s in exported if not re.match(RUNTIME_PROPER, s)}
        elif path.name == "libfastpar.so":
            if not c_abi <= exported:
                problems.append(f"libfastpar.so does not export {sorted(c_abi - exported)}")
            allowed = {s for s in exported if s in c_abi or FASTPAR_CXX.match(s)}
        elif path.name.startswith("_") and ".so" in path.name:  # a Python extension module
            allowed = {f"PyInit_{path.name.split('.')[0]}"} & exported
            if not allowed:
                problems.append(f"{path.name} does not export its PyInit_ function")
        else:
            problems.append(f"{path.name}: a shared object this test does not know; say what it may export")
            continue
        wrong = exported - allowed
        if wrong:
            runtime = sorted(s for s in wrong if CXX_RUNTIME.match(s))
            llama = sorted(s for s in wrong if LLAMA.match(s))
            problems.append(f"{path.name} exports {len(wrong)} symbols beyond its interface "
                            f"({len(runtime)} of the C++ runtime, {len(llama)} of llama.cpp/ggml), e.g. "
                            f"{(runtime + llama + sorted(wrong - set(runtime) - set(llama)))[:8]}")
    return problems


def test_shared_objects_export_their_interface_only():
    if not sys.platform.startswith("linux"):
        pytest.skip("ELF shared objects (Linux) only")
    pytest.importorskip("elftools")
    problems = export_problems()
    assert not problems, "\n".join(problems)


# The test and benchmark probes live in fastpar._testing alone (csrc/testing/), never in
# libfastpar. Itanium mangling spells every identifier out as written (its length before
# it), so a function's name is a substring of its symbol. The step-policy override was
# Context::generate taking a StepPolicy.
PROBES = ("sample_against_llama", "measure_grammar", "compare_masks", "way_name")
POLICY_OVERRIDE = re.compile(r"7Context8generate.*10StepPolicy")
# What fastpar._testing offers of them: way_name is choose_way's answer.
TESTING_PROBES = ("sample_against_llama", "measure_grammar", "compare_masks", "choose_way", "generate_with_policy",
                  "set_allowed_sets", "allowed_sets")


def test_probes_are_in_the_test_module_not_in_libfastpar():
    if not sys.platform.startswith("linux"):
        pytest.skip("ELF shared objects (Linux) only")
    pytest.importorskip("elftools")
    from fastpar import _testing

    libs = [p for p in shipped_shared_objects() if p.name == "libfastpar.so"]
    assert len(libs) == 1, libs
    exported = exported_symbols(libs[0])
    assert any("7Context8generate" in s for s in exported)  # the names are there to be read
    leaked = sorted(s for s in exported if any(p in s for p in PROBES) or POLICY_OVERRIDE.search(s))
    assert not leaked, leaked
    missing = [name for name in TESTING_PROBES if not callable(getattr(_testing, name, None))]
    assert not missing, missing


# ---------------------------------------------------------------------------
# As a script, for a GPU machine
# ---------------------------------------------------------------------------


def main(argv=None) -> int:
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(description="fastpar and other C++ extensions in both import orders")
    parser.add_argument("--torch", action="store_true", help="also import torch and make a CUDA tensor")
    parser.add_argument("--model", help="GGUF path (default: fastpar's default model)")
    args = parser.parse_args(argv)
    import importlib.util

    needed = ["numpy", "matplotlib", "contourpy", "kiwisolver"] + (["torch"] if args.torch else [])
    needed += ["elftools"] if sys.platform.startswith("linux") else []
    missing = [name for name in needed if importlib.util.find_spec(name) is None]
    if missing:
        print(f"not installed: {', '.join(missing)} (pip install '.[test]'{' torch' if args.torch else ''})")
        return 2
    import fastpar  # only to find the model and the backend; each order runs in its own process

    print(f"fastpar {fastpar.__version__} ({fastpar.backend()} build), {fastpar.get_library()}")
    problems = export_problems() if sys.platform.startswith("linux") else []
    if sys.platform.startswith("linux"):
        print(f"exported symbols of {len(shipped_shared_objects())} shared objects: "
              + ("interface only" if not problems else "\n  ".join(["TOO MANY"] + problems)), flush=True)
    model_path = args.model or fastpar.default_model_path()
    n_gpu_layers = -1 if fastpar.backend() != "cpu" else 0
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        fp = fastpar_code(model_path, n_gpu_layers)
        others = others_code(str(pathlib.Path(tmp) / "figure.png")) + (TORCH_CODE if args.torch else "")
        names = "numpy, matplotlib Agg, contourpy, kiwisolver" + (", torch cuda" if args.torch else "")
        for label, first, second in ((f"fastpar, then {names}", fp, others),
                                     (f"{names}, then fastpar", others, fp)):
            proc = run_order(first, second)
            print(f"{label}: {describe(proc)}", flush=True)
            if proc.returncode != 0:
                failed += 1
                sys.stdout.write(proc.stdout[-2000:] + proc.stderr[-4000:])
    return 1 if failed or problems else 0


if __name__ == "__main__":
    sys.exit(main())
