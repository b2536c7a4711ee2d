"""Sums an `ncu --csv --metrics gpu__time_duration.sum` log by kernel: where a GPU step's time goes.

    GGML_CUDA_DISABLE_GRAPHS=1 ncu --csv --metrics gpu__time_duration.sum --launch-skip 7500 \\
        --launch-count 1900 llama-batched-bench -m SPEED_MODEL -c 25088 -b 2048 -ub 2048 \\
        -npp 32 -ntg 50 -npl 256 -no-kvu -ngl 999 > kernels.csv
    python bench/ncu_report.py kernels.csv N_STEPS

(graphs off so that ncu sees each kernel; --launch-skip passes the prompt's passes.) Prints
the kernels' summed time, then per kernel name ms a step, share and launches a step.
"""
import collections
import csv
import sys

UNIT_US = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}

rows = list(csv.reader(open(sys.argv[1])))
steps = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
head = next(i for i, r in enumerate(rows) if r and r[0] == "ID")
cols = rows[head]
k, m, v, u = (cols.index(c) for c in ("Kernel Name", "Metric Name", "Metric Value", "Metric Unit"))
total, count = collections.Counter(), collections.Counter()
for r in rows[head + 1:]:
    if len(r) > v and r[m] == "gpu__time_duration.sum":
        name = r[k].split("(")[0].split("<")[0][:60]
        total[name] += float(r[v].replace(",", "")) * UNIT_US[r[u]]
        count[name] += 1
all_us = sum(total.values())
print(f"{sum(count.values())} kernels, {all_us / 1e3:.2f} ms, {all_us / 1e3 / steps:.2f} ms a step ({steps:g} steps)")
for name, us in total.most_common(25):
    print(f"{us / steps / 1e3:8.3f} ms a step {100 * us / all_us:5.1f} %  {count[name] / steps:6.1f} a step  {name}")
