"""The Python in README.md and docs/*.md runs as written, and prints what the docs show.

Every ```python block is a test of its own, run on the default model in a fresh process
whose working folder is an empty temporary one. An unmarked block that raises fails, so a
new doc stays runnable. What a block needs to run, it says in the doc itself, where a reader
sees it:

* a first line ``# needs ...``: the block needs what the comment says (a file, a download,
  a running server) and is not run; the test lists it as skipped with that comment;
* ``<!-- snippet: continues -->`` on the line before the fence: the block runs after the
  block before it in the same doc, in the same process and namespace, as a reader runs them
  one after the other (it is skipped when that block is);
* ``<!-- snippet: file PATH -->`` before any other fenced block: its text is written to PATH
  in the working folder before the doc's Python runs (a task's YAML, its data);
* ``<!-- snippet: ray -->`` before a Python block: it starts a local Ray cluster; it runs
  where Ray is installed (``fastpar[ray]``, Python 3.10+) and carries the ``ray`` marker,
  as tests/test_ray.py does.
* ``<!-- snippet: lm-eval -->`` before a Python block: it runs where lm-evaluation-harness
  is installed (``fastpar[lm-eval]``, in the test extra), as tests/test_lm_eval.py does.

A block written as a ``>>>`` session is run by doctest (ELLIPSIS, NORMALIZE_WHITESPACE):
the outputs it shows are compared, so every number the docs show is one the code prints.
The docs show the CPU build's numbers with few digits. On a GPU build (llama.cpp's GPU
backend may take the matrix products of a large batch even with no layers offloaded, and
rounds differently) each session must still run without an exception, but its outputs are
not compared.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import pytest

import fastpar

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
COMPARE_OUTPUTS = fastpar.backend() == "cpu"
TIMEOUT_S = 600  # per chain of blocks: a hang fails instead of stalling the suite

_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+.-]*)\s*$")
_MARKER = re.compile(r"^\s*<!--\s*snippet:\s*(.*?)\s*-->\s*$")
_NEEDS = re.compile(r"^#\s*needs\b\s*(.*)$")


@dataclass
class Block:
    doc: str  # path relative to the repository
    line: int  # 1-based line of the block's first line of code
    lang: str
    code: str
    marker: Optional[str]  # the text of the <!-- snippet: ... --> right before the fence
    chain: List["Block"] = field(default_factory=list, repr=False)

    @property
    def name(self) -> str:
        return f"{self.doc}:{self.line}"

    @property
    def needs(self) -> Optional[str]:
        first = self.code.lstrip("\n").split("\n", 1)[0].strip()
        m = _NEEDS.match(first)
        return m.group(1) if m else None

    @property
    def doctest(self) -> bool:
        return any(line.startswith(">>> ") or line == ">>>" for line in self.code.splitlines())


def _blocks(path: pathlib.Path) -> List[Block]:
    """Every fenced block of a Markdown file, with the snippet marker before it."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m.groups()
        j = i + 1
        while j < len(lines) and not (lines[j].strip().startswith(fence[0] * len(fence))
                                      and set(lines[j].strip()) == {fence[0]}):
            j += 1
        body = [line[len(indent):] if line.startswith(indent) else line.lstrip() for line in lines[i + 1:j]]
        k = i - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        marker = _MARKER.match(lines[k]) if k >= 0 else None
        blocks.append(Block(str(path.relative_to(ROOT)), i + 2, lang.lower(), "\n".join(body) + "\n",
                            marker.group(1) if marker else None))
        i = j + 1
    return blocks


def _collect():
    """The Python blocks, each linked to its chain, and each doc's files."""
    python: List[Block] = []
    files: Dict[str, Dict[str, str]] = {}
    problems: List[str] = []
    for path in DOCS:
        previous: Optional[Block] = None
        for b in _blocks(path):
            kind = (b.marker or "").split(maxsplit=1)
            if b.lang != "python":
                if kind and kind[0] == "file" and len(kind) == 2:
                    files.setdefault(b.doc, {})[kind[1]] = b.code
                elif b.marker is not None:
                    problems.append(f"{b.name}: a {b.lang or 'plain'} block takes only <!-- snippet: file PATH -->")
                continue
            if b.marker not in (None, "continues", "ray", "lm-eval"):
                problems.append(f"{b.name}: unknown marker <!-- snippet: {b.marker} -->")
            if b.needs == "":
                problems.append(f"{b.name}: '# needs' must say what the block needs")
            if b.marker == "continues":
                if previous is None:
                    problems.append(f"{b.name}: 'continues', but no Python block comes before it")
                    b.chain = [b]
                else:
                    b.chain = previous.chain
                    b.chain.append(b)
            else:
                b.chain = [b]
            python.append(b)
            previous = b
    return python, files, problems


BLOCKS, FILES, PROBLEMS = _collect()

# The runner, in the block's own process: each block of a chain in one namespace, in order;
# a >>> session through doctest. Code is padded to its line in the doc, so that a traceback
# names the doc's own line. One JSON line of result per block; it stops at the first failure.
_RUNNER = r'''
import doctest, io, json, sys, traceback
blocks, compare, results = json.load(open(sys.argv[1])), sys.argv[2] == "1", open(sys.argv[3], "w")

class RunOnly(doctest.OutputChecker):
    def check_output(self, want, got, optionflags):
        return True

ns = {"__name__": "__main__"}
for b in blocks:
    result = {"ok": True}
    try:
        if b["doctest"]:
            test = doctest.DocTestParser().get_doctest(b["code"], ns, b["name"], b["path"], b["line"] - 1)
            runner = doctest.DocTestRunner(checker=None if compare else RunOnly(),
                                           optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
            report = io.StringIO()
            runner.run(test, out=report.write, clear_globs=False)
            ns.update(test.globs)
            if runner.failures:
                result = {"ok": False, "error": report.getvalue()}
        else:
            exec(compile("\n" * (b["line"] - 1) + b["code"], b["path"], "exec"), ns)
    except BaseException:
        result = {"ok": False, "error": traceback.format_exc()}
    results.write(json.dumps(dict(name=b["name"], **result)) + "\n")
    results.flush()
    if not result["ok"]:
        break
'''

_RESULTS: Dict[int, Dict[str, dict]] = {}


def _run_chain(chain: List[Block]) -> Dict[str, dict]:
    """Runs the chain's blocks up to its first '# needs' block, once; each block's result."""
    key = id(chain)
    if key in _RESULTS:
        return _RESULTS[key]
    runnable = []
    for b in chain:
        if b.needs is not None:
            break
        runnable.append(b)
    with tempfile.TemporaryDirectory(prefix="fastpar-docs-") as work:
        for rel, text in FILES.get(chain[0].doc, {}).items():
            target = pathlib.Path(work, rel)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
        spec = pathlib.Path(work, ".blocks.json")
        spec.write_text(json.dumps([dict(name=b.name, path=str(ROOT / b.doc), line=b.line, code=b.code,
                                         doctest=b.doctest) for b in runnable]))
        out = pathlib.Path(work, ".results.jsonl")
        try:
            proc = subprocess.run([sys.executable, "-c", _RUNNER, str(spec), "1" if COMPARE_OUTPUTS else "0", str(out)],
                                  cwd=work, capture_output=True, text=True, timeout=TIMEOUT_S)
            tail = (proc.stdout[-3000:] + "\n" + proc.stderr[-6000:]).strip()
            crashed = None if proc.returncode == 0 else f"the process exited with {proc.returncode}"
        except subprocess.TimeoutExpired as e:
            tail = ((e.stdout or b"")[-3000:].decode(errors="replace") + "\n"
                    + (e.stderr or b"")[-6000:].decode(errors="replace")).strip()
            crashed = f"not done after {TIMEOUT_S} s"
        results = {}
        if out.exists():
            for line in out.read_text().splitlines():
                r = json.loads(line)
                results[r.pop("name")] = r
    if not any(not r["ok"] for r in results.values()):
        missing = [b for b in runnable if b.name not in results]
        if missing:  # the process died or hung inside this block
            results[missing[0].name] = {"ok": False, "error": f"{crashed or 'no result'}; its output:\n{tail}"}
        elif crashed and runnable:  # every block ran, but the process did not end cleanly
            results[runnable[-1].name] = {"ok": False, "error": f"after the last block, {crashed}; its output:\n{tail}"}
    _RESULTS[key] = results
    return results


def _param(b: Block):
    marks = [pytest.mark.ray] if any(x.marker == "ray" for x in b.chain) else []
    return pytest.param(b, id=b.name, marks=marks)


def test_markers_are_well_formed():
    """Every snippet marker is one the runner knows, and the docs hold Python to run."""
    assert not PROBLEMS, "\n".join(PROBLEMS)
    docs = {b.doc for b in BLOCKS}
    assert "README.md" in docs and "docs/scoring.md" in docs, docs
    assert sum(b.needs is None for b in BLOCKS) >= 10, [b.name for b in BLOCKS]


@pytest.mark.parametrize("block", [_param(b) for b in BLOCKS])
def test_snippet(block: Block):
    chain = block.chain
    before = chain[:chain.index(block)]
    if block.needs is not None:
        pytest.skip(f"{block.name} needs {block.needs}")
    skipped = next((b for b in before if b.needs is not None), None)
    if skipped is not None:
        pytest.skip(f"{block.name} continues {skipped.name}, which needs {skipped.needs}")
    if any(b.marker == "ray" for b in chain):
        pytest.importorskip("ray", reason=f"{block.name} needs fastpar[ray] (Python 3.10+)")
    if any(b.marker == "lm-eval" for b in chain):
        pytest.importorskip("lm_eval", reason=f"{block.name} needs fastpar[lm-eval]")
    results = _run_chain(chain)
    failed = next((b for b in before if not results.get(b.name, {}).get("ok")), None)
    if failed is not None:
        pytest.skip(f"{block.name} not run: {failed.name}, before it in the same chain, failed")
    result = results.get(block.name)
    assert result is not None, f"{block.name}: no result"
    if not result["ok"]:
        pytest.fail(f"{block.name} failed:\n{result['error']}", pytrace=False)
