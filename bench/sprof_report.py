"""Sums a bench/c/sprof.c sample file: python bench/sprof_report.py FILE HZ N_STEPS [TITLE].

Each sample goes to the first class whose function is on its stack (decode: inside
llama_decode; sync: llama_synchronize; sample: fastpar choosing tokens; other), then per class
the functions by inclusive and by self time, in ms a step (samples / HZ / N_STEPS). Names come
from addr2line (binutils)."""
import collections, os, subprocess, sys

path, hz, steps = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
title = sys.argv[4] if len(sys.argv) > 4 else path
samples = []
for ln in open(path):
    fr = [x.rsplit(" ", 1) for x in ln.rstrip("\n|").split("|") if x]
    samples.append([(a, int(b, 16)) for a, b in fr])
SKIP = ("handler [", "sigaction", "restore_rt")
need = collections.defaultdict(set)
for s in samples:
    for lib, off in s:
        need[lib].add(off)
name = {}
for lib, offs in need.items():
    offs = sorted(offs)
    short = os.path.basename(lib)
    if lib != "?" and os.path.exists(lib):
        out = subprocess.run(["addr2line", "-f", "-C", "-e", lib] + [hex(o) for o in offs], capture_output=True, text=True).stdout.splitlines()
        fn = out[0::2]
    else:
        fn = ["??"] * len(offs)
    for o, f in zip(offs, fn):
        f = f.split("(")[0] if f != "??" else "??"
        name[(lib, o)] = f"{f} [{short}]" if f != "??" else f"?? [{short}]"
ms = 1000.0 / hz / steps
classes = [("decode", ("llama_decode", "llama_process", "llama_context::decode")), ("sync", ("llama_synchronize",)),
           ("sample", ("Scheduler::sample", "TaskPool::run")), ]
by = collections.defaultdict(list)
for s in samples:
    fns = [name[f] for f in s]
    cut = max([i for i, f in enumerate(fns[:4]) if any(k in f for k in SKIP)], default=-1)
    fns = fns[cut + 1:] or ["(none)"]
    c = "other"
    for cname, keys in classes:
        if any(any(k in fn for k in keys) for fn in fns):
            c = cname
            break
    by[c].append(fns)
print(f"\n### {title}: {len(samples)} samples at {hz:.0f} Hz, ms a step over {steps:.0f} steps: " +
      ", ".join(f"{c} {len(v) * ms:.3f}" for c, v in sorted(by.items())))
for c in ("decode", "other"):
    v = by.get(c, [])
    if not v:
        continue
    inc = collections.Counter(); leaf = collections.Counter()
    for fns in v:
        for f in set(fns):
            inc[f] += 1
        leaf[fns[0]] += 1
    print(f"  {c}: inclusive (ms a step)")
    for f, k in inc.most_common(45):
        print(f"    {k * ms:8.3f}  {f[:140]}")
    print(f"  {c}: self")
    for f, k in leaf.most_common(20):
        print(f"    {k * ms:8.3f}  {f[:140]}")
