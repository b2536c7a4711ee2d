"""The server, Ray and lm-eval modules are clients of fastpar like any user's code: they
stand on its public API alone and touch no underscore name of fastpar's, neither a private
module or name they import nor a private attribute of a fastpar object (docs/design.md)."""

from __future__ import annotations

import ast
import pathlib
from typing import List, Set

import fastpar

PACKAGE = pathlib.Path(fastpar.__file__).parent


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _clients() -> List[pathlib.Path]:
    return [PACKAGE / "ray.py", PACKAGE / "lm_eval.py", *sorted((PACKAGE / "server").glob("*.py"))]


def _fastpar_private_names() -> Set[str]:
    """Every underscore name fastpar's own modules define: modules, functions, classes,
    attributes they assign, module-level names."""
    names = {"_core", "_testing"}  # the native modules
    clients = set(_clients())
    for path in PACKAGE.glob("*.py"):
        if path in clients:
            continue
        if _private(path.stem):
            names.add(path.stem)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = node.name
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                name = node.attr
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                name = node.id
            else:
                continue
            if _private(name):
                names.add(name)
    return names


def private_uses(source: str, module: str, own: str, fastpar_private: Set[str]) -> List[str]:
    """Where `source` (the module named `module`, whose own package is `own`) reaches into
    fastpar: an import of a private module or of a private name from outside `own`, or a
    private attribute of fastpar's on anything but the client's own `self`/`cls`."""
    found = []  # (line, what)
    package = module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "fastpar" and any(_private(p) for p in alias.name.split(".")):
                    found.append((node.lineno, f"import {alias.name}"))
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            if target.split(".")[0] != "fastpar":
                continue
            inside = target == own or target.startswith(own + ".")
            if any(_private(p) for p in target.split(".")) and not inside:
                found.append((node.lineno, f"from {target} import ..."))
            for alias in node.names:
                if _private(alias.name) and not inside:
                    found.append((node.lineno, f"from {target} import {alias.name}"))
        elif isinstance(node, ast.Attribute) and node.attr in fastpar_private:
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                found.append((node.lineno, f".{node.attr}"))
    return [f"line {line}: {what}" for line, what in sorted(found)]


def test_the_check_finds_what_the_clients_once_did():
    names = _fastpar_private_names()
    assert {"_core", "_engine", "_handle", "_model", "_ctx", "_scoring", "_CONTEXT_DEFAULTS"} <= names
    old = ("from . import _core, _scoring\n"
           "from ._openai import parse\n"
           "from fastpar._options import _CONTEXT_DEFAULTS\n"
           "import fastpar._core\n"
           "n = engine._engine.n_parallel\n"
           "request._handle.take_pieces()\n"
           "self.config._map_batches_kwargs()\n")  # a client's own private name: allowed
    found = private_uses(old, "fastpar.ray", "fastpar.ray", names)
    assert [f.split(":")[0] for f in found] == ["line 1", "line 1", "line 2", "line 3", "line 3", "line 4",
                                                "line 5", "line 6"], found
    own = "from .protocol import parse\nfrom . import protocol\n"
    assert private_uses(own, "fastpar.server.app", "fastpar.server", names) == []


def test_server_ray_and_lm_eval_use_only_public_names():
    names = _fastpar_private_names()
    for path in _clients():
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        module = ".".join(rel.parts)
        own = "fastpar.server" if rel.parts[1] == "server" else module
        found = private_uses(path.read_text(encoding="utf-8"), module, own, names)
        assert not found, f"{rel}: {found}"
