"""The options' one field list (fastpar_fields.h, installed beside fastpar.h) against every
place that declares an option: the core's structs, fastpar.h, the C defaults, Python's public
keywords and SamplingParams, and the R package's functions. A field that one of them lacks, or
declares with another default, fails here, naming the field."""

from __future__ import annotations

import dataclasses
import inspect
import pathlib
import re
import shutil
import subprocess
from typing import Dict, List, NamedTuple

import pytest

import fastpar
from fastpar import _core, _options
from test_capi import compile_c

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIELDS_H = pathlib.Path(fastpar.get_include()) / "fastpar_fields.h"
CORE_DEFAULTS = {"model": _core.ModelParams(), "context": _core.ContextParams(), "generate": _core.GenerateParams()}
CORE_STRUCTS = {"model": "ModelParams", "context": "ContextParams", "generate": "GenerateParams"}


class Field(NamedTuple):
    name: str
    kind: str
    c: bool  # a field of fastpar.h's struct
    py: bool  # a public Python option
    r: bool  # an option of the R package


def field_lists() -> Dict[str, List[Field]]:
    """{"model" | "context" | "generate": the list's fields in order}."""
    text = FIELDS_H.read_text()
    lists = {}
    for struct, body in re.findall(r"#define FASTPAR_(\w+)_FIELDS\(X\)((?:.*\\\n)*.*)", text):
        rows = re.findall(r"X\((\w+),\s*(\w+),\s*([01]),\s*([01]),\s*([01])\)", body)
        lists[struct.lower()] = [Field(name, kind, c == "1", py == "1", r == "1") for name, kind, c, py, r in rows]
    assert sorted(lists) == ["context", "generate", "model"] and all(lists.values()), text
    return lists


FIELDS = field_lists()


def struct_members(text: str, opening: str) -> List[str]:
    """The member names of the struct whose body follows `opening`, in order."""
    body = text[text.index(opening) + len(opening):]
    body = re.sub(r"/\*.*?\*/|//[^\n]*", "", body[:body.index("}")], flags=re.S)
    return re.findall(r"(\w+)\s*(?:=[^;]*)?;", body)


def test_the_list_holds_every_field_of_the_core_structs_in_order():
    params_hpp = (ROOT / "csrc" / "core" / "base" / "params.hpp").read_text()
    for struct, fields in FIELDS.items():
        names = [f.name for f in fields]
        assert struct_members(params_hpp, f"struct {CORE_STRUCTS[struct]} {{") == names, \
            f"csrc/core/base/params.hpp's {CORE_STRUCTS[struct]} and fastpar_fields.h's list differ"
        core = CORE_DEFAULTS[struct]
        assert sorted(n for n in dir(core) if not n.startswith("_") and n != "validate") == sorted(names)
        for f in fields:
            assert not (f.r and not f.c), f"{f.name}: R reaches options through the C ABI (R = 1 needs C = 1)"


def test_fastpar_h_declares_exactly_the_fields_the_list_puts_in_the_c_abi():
    header = (pathlib.Path(fastpar.get_include()) / "fastpar.h").read_text()
    for struct, fields in FIELDS.items():
        expected = []
        for f in fields:
            if f.c:
                expected += [f.name, f"n_{f.name}"] if f.kind in ("STRINGS", "BIASES", "TOKENS") else [f.name]
        assert struct_members(header, f"typedef struct fastpar_{struct}_params {{") == expected, struct


def test_c_defaults_are_the_cores(tmp_path):
    """A C program walks the lists with the X-macros and prints each C default."""
    run = subprocess.run([str(compile_c("capi_defaults", tmp_path))], capture_output=True, text=True, check=True)
    printed = {}
    for line in run.stdout.splitlines():
        struct, name, value = line.split(" ", 2)
        printed[struct, name] = value
    for struct, fields in FIELDS.items():
        core = CORE_DEFAULTS[struct]
        for f in (f for f in fields if f.c):
            got, want = printed.pop((struct, f.name)), getattr(core, f.name)
            if f.kind == "STRING":
                assert got == (want if want else "none"), f"{f.name}: C gives {got!r}, the core {want!r}"
            elif f.kind in ("STRINGS", "BIASES", "TOKENS"):
                assert (got, want) == ("0", []), f"{f.name}: C gives {got} entries, the core {want!r}"
            else:  # float32 values print exactly (%.17g of the same float)
                assert float(got) == float(want), f"{struct} {f.name}: C gives {got}, the core {want!r}"
    assert not printed, f"the C program printed fields the list does not put in the C ABI: {printed}"


def python_defaults(func) -> Dict[str, object]:
    return {p.name: p.default for p in inspect.signature(func).parameters.values()
            if p.default is not inspect.Parameter.empty}


def test_python_declares_each_public_option_with_the_cores_default():
    sp_fields = {f.name for f in dataclasses.fields(fastpar.SamplingParams)}
    keywords = python_defaults(fastpar.generate_parallel)
    default_sp = fastpar.SamplingParams()._params  # every Python default, converted
    for f in FIELDS["generate"]:
        assert (f.name in sp_fields) == f.py, f"{f.name}: SamplingParams {'lacks' if f.py else 'declares'} it"
        assert (f.name in keywords) == f.py, f"{f.name}: generate_parallel's keywords {'lack' if f.py else 'hold'} it"
        want = getattr(CORE_DEFAULTS["generate"], f.name)
        assert getattr(default_sp, f.name) == want, f"{f.name}: SamplingParams() gives another default"
    model_keywords = python_defaults(fastpar.Model.__init__)
    for f in FIELDS["model"]:
        assert (f.name in model_keywords) == f.py, f"{f.name}: Model() {'lacks' if f.py else 'takes'} it"
        if f.py:
            assert model_keywords[f.name] == getattr(CORE_DEFAULTS["model"], f.name), f.name
    for cls in (fastpar.Context, fastpar.Engine):
        keywords = python_defaults(cls.__init__)
        public = [f.name for f in FIELDS["context"] if f.py]
        assert [n for n in keywords if n in {f.name for f in FIELDS["context"]}] == public, cls.__name__
        # None stands for the core's "auto" value: converted, every default is the core's.
        converted = _options._context_params(**{n: keywords[n] for n in public})
        for name in public:
            assert getattr(converted, name) == getattr(CORE_DEFAULTS["context"], name), f"{cls.__name__} {name}"


@pytest.mark.skipif(shutil.which("Rscript") is None, reason="R is not installed (.ci/run installs it)")
def test_r_functions_take_exactly_the_options_the_list_gives_r(tmp_path):
    """The R functions' options, read from the package's R code (r/R/) without building it;
    their defaults are fastpar_default_params(), which the R suite compares with Python's."""
    code = """
    for (f in list.files(commandArgs(TRUE)[1], full.names = TRUE)) source(f)
    show <- function(struct, names) cat(struct, names, "\\n")
    show("model", .options("model"))
    show("context", .options("context"))
    show("generate", .options("generate"))
    """
    run = subprocess.run(["Rscript", "-e", code, str(ROOT / "r" / "R")], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    taken = {line.split()[0]: set(line.split()[1:]) for line in run.stdout.splitlines() if line.strip()}
    for struct, fields in FIELDS.items():
        for f in fields:
            assert (f.name in taken[struct]) == f.r, \
                f"{f.name}: the R package {'lacks' if f.r else 'takes'} it (fastpar_fields.h says R = {int(f.r)})"
        assert taken[struct] <= {f.name for f in fields}, struct
