#!/usr/bin/env python3
"""A longer fuzz of malformed model files than tests/test_model_fuzz.py (not a test).

Every named mutant of tests/gguf_mutants.py once, then random ones (half semantic: random
hyperparameters and tensor shapes; half byte-level: truncations, random bytes, huge counts)
up to --mutants; each is loaded in a process of its own and, when it loads, generates four
tokens. Prints the counts (mutants, raised, loaded, crashed, hung, failed) and every
mutant that did not raise or run; exits 1 if there was one.

    python bench/fuzz_models.py --mutants 5000 [--seed 1] [--jobs 2] [--model PATH]
"""

from __future__ import annotations

import argparse
import collections
import pathlib
import random
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))

import gguf_mutants as gm  # noqa: E402

import fastpar  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mutants", type=int, default=5000, help="how many in all (at least the named ones)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=2, help="mutants tried at once")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds before a mutant counts as hung")
    ap.add_argument("--layers", type=int, default=2, help="layers of the model kept in the mutants")
    ap.add_argument("--model", default=None, help="the model to mutate (default: fastpar's default model)")
    ap.add_argument("--workdir", default=None, help="where mutant files are written (one per job at a time)")
    args = ap.parse_args()

    base = gm.Base.read(args.model or fastpar.default_model_path()).shrunk(args.layers)
    rng = random.Random(args.seed)
    named = gm.semantic_mutants(base)
    n_rest = max(0, args.mutants - len(named))
    mutants = (named + gm.random_semantic_mutants(base, n_rest // 2, rng) +
               gm.byte_mutants(base, n_rest - n_rest // 2, rng))

    counts: collections.Counter = collections.Counter()
    bad = []
    start = time.monotonic()
    with tempfile.TemporaryDirectory(dir=args.workdir) as workdir:
        for i, o in enumerate(gm.run_all(mutants, workdir, args.timeout, args.jobs), 1):
            counts[o.verdict] += 1
            if o.verdict not in ("raised", "loaded"):
                bad.append(o)
                print(f"{o.verdict}: {o.mutant}: {o.detail}", flush=True)
            if i % 250 == 0 or i == len(mutants):
                print(f"{i}/{len(mutants)} in {time.monotonic() - start:.0f} s: {dict(counts)}", flush=True)

    print(f"mutants {len(mutants)}, raised {counts['raised']}, loaded {counts['loaded']}, crashed "
          f"{counts['crashed']}, hung {counts['hung']}, failed {counts['failed']} "
          f"(seed {args.seed}, {time.monotonic() - start:.0f} s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
