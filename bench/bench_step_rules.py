#!/usr/bin/env python3
"""Outputs of different lengths under each GPU step rule (core/loop/step_policy.hpp).

1,024 prompts (the extraction prompts of bench_structured.py as plain text), 256 slots,
greedy: every prompt generating the same number of tokens (a lockstep load), then each
generating a length of its own (slots refilled as outputs end, so most steps mix prompt
chunks with generated tokens) with the context's step policy and with one rule changed at
a time; then both loads again on a second context with one KV buffer for all slots
(kv_unified=True, where llama.cpp runs a step as one pass instead of one per run of slots
with equal chunks). The lengths are those the prompts' JSON-schema outputs have (one
constrained call first), the lockstep length their mean, so both loads generate about the
same tokens.

--workload words: prompts of about 35 tokens (30 random words, the same on every machine),
each generating a random 34-96 tokens (mean 65), `n_ctx_per_seq` 160, no constrained call:
the load on which refills in waves were measured (`--loads waves` runs it with the refills
at once and in waves of 16 and 64 beside the context's rules); `--loads "given order"` runs
it with the prompts admitted in the order given instead of largest max_tokens first
(StepPolicy::longest_first).

--loads Engine adds the same loads through an Engine (every prompt submitted at once, as
`bench/run.py`'s stage 9; the Engine's own rules, refills at once, and waves held without
bound), each row with its ratio to the same load in one call.

The loads take turns, --reps rounds. Printed per load: the median wall time, generated
tokens/s (wall clock) and its ratio to the lockstep load's, llama_decode calls and ms a
call, padding tokens, and how many outputs equal those of the own lengths under the
context's rules (on a GPU a batch of another shape may round a near-tie the other way; on
a CPU all do); written as JSON with --out.

    python bench/bench_step_rules.py --model SPEED_MODEL.gguf [--workload words] [--loads waves] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import random
import statistics
import sys
import time

import fastpar
from fastpar import _core, _testing
from fastpar._options import _context_params

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from bench_structured import SCHEMA, prompts, ticket_text  # noqa: E402 - the same task

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau".split()


def params(n_tokens: int, ignore_eos: bool = True):
    p = _core.GenerateParams()
    p.max_tokens, p.temperature, p.seed, p.ignore_eos = n_tokens, 0.0, 1, ignore_eos
    return p


def fifo_calls(lengths: list, slots: int, wave: int, first_wave_calls: int) -> int:
    """Decode calls that refills in the order of `lengths` (as admitted) need for these output
    lengths, whatever a step costs: the first `slots` prompts take `first_wave_calls` calls;
    then each call gives every running sequence a token, and a prompt taking a freed slot
    (once `wave` are free or as many as wait; 0: at once) rides one call with its chunk and
    yields its first token with the next. With every step as cheap as a lockstep step, the
    lockstep load's calls over these are the most an own-lengths load can make of it: the last
    prompts admitted end one by one (the tail)."""
    queue, running, calls = list(lengths[slots:]), list(lengths[:slots]), first_wave_calls
    while running or queue:
        free = slots - len(running)
        n = min(free, len(queue)) if queue and (not running or free >= min(wave, len(queue)) or not wave) else 0
        admitted, queue = queue[:n], queue[n:]
        running = [r - 1 for r in running if r > 1] + admitted
        calls += 1
    return calls


def run_on_engine(engine, texts: list, each: list):
    """Every text submitted at once to `engine` (a fastpar._core.Engine), with each[i] (or each[0]
    for all), and awaited: the completions, and the engine's counters over the run."""
    s0 = engine.stats()
    handles = [engine.submit(t, each[i] if len(each) > 1 else each[0]) for i, t in enumerate(texts)]
    out = [h.result(600)[0] for h in handles]
    s1 = engine.stats()
    counted = ("n_gen_tokens", "n_decode_calls", "n_padding_tokens")
    return out, argparse.Namespace(**{k: getattr(s1, k) - getattr(s0, k) for k in counted})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="GGUF, every layer on the GPU (the F16 speed model)")
    ap.add_argument("--prompts", type=int, default=1024)
    ap.add_argument("--slots", type=int, default=256)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--workload", choices=("extraction", "words"), default="extraction",
                    help="the prompts and lengths (see above)")
    ap.add_argument("--n-gpu-layers", type=int, default=-1, help="0 runs the GPU's rules on the CPU (a check)")
    ap.add_argument("--loads", default=None,
                    help="only the loads whose names contain one of these comma-separated words, "
                         "besides the lockstep load and the own lengths under the context's rules")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    model = fastpar.Model(args.model, n_gpu_layers=args.n_gpu_layers)
    n_ctx_per_seq = 512 if args.workload == "extraction" else 160
    ctx = fastpar.Context(model, n_parallel=args.slots, n_ctx_per_seq=n_ctx_per_seq)
    if args.workload == "extraction":
        texts = [ticket_text(i) for i in range(args.prompts)]
        constrained = params(96, ignore_eos=False)
        constrained.json_schema = json.dumps(SCHEMA)
        ctx._ctx.generate(prompts(args.slots), [params(96)], None)  # warm-up
        lengths = [max(1, c.n_gen_tokens) for c in ctx._ctx.generate(prompts(args.prompts), [constrained], None)]
    else:
        rnd = random.Random(7)
        texts = [" ".join(rnd.choice(WORDS) for _ in range(30)) + f" {i}" for i in range(args.prompts)]
        lengths = [rnd.randint(34, 96) for _ in range(args.prompts)]
        ctx._ctx.generate(texts[:args.slots], [params(32)], None)  # warm-up
    mean = round(sum(lengths) / len(lengths))
    each = [params(n) for n in lengths]

    def policy(kv_unified=False, **changes):
        p = _testing.resolve_step_policy(output_on_gpu=True, kv_unified=kv_unified, memory_copies_by_position=True,
                                         share_prefixes=True, n_parallel=args.slots, n_threads=ctx.n_threads)
        for name, value in changes.items():
            setattr(p, name, value)
        return p

    # (name, where: False the context, True the unified one, or an engine's name; params; a call's policy)
    loads = [
        ("lockstep, the mean length", False, [params(mean)], policy()),
        ("own lengths", False, each, policy()),
        ("own lengths, no padding", False, each, policy(max_padded_gap=0)),
        ("own lengths, slots not kept together", False, each, policy(compact_slots=False)),
        ("own lengths, refills at once (no waves)", False, each, policy(refill_wave=0)),
        ("own lengths, in the given order", False, each, policy(longest_first=False)),
        ("own lengths, in the given order, refills at once", False, each, policy(longest_first=False, refill_wave=0)),
        ("own lengths, waves of 16", False, each, policy(refill_wave=16)),
        ("own lengths, waves of 64", False, each, policy(refill_wave=64)),
        ("own lengths, every gap padded", False, each, policy(max_padded_gap=1 << 30)),
        ("own lengths, no last-token rule", False, each, policy(last_prompt_token_alone=False)),
        ("own lengths, no prompts-first steps", False, each, policy(prompts_first=False)),
        ("lockstep, chunks not padded to one length", False, [params(mean)], policy(equal_chunks=False)),
        ("own lengths, chunks not padded to one length", False, each, policy(equal_chunks=False)),
        ("kv_unified: lockstep, the mean length", True, [params(mean)], policy(kv_unified=True)),
        ("kv_unified: own lengths", True, each, policy(kv_unified=True)),
        ("Engine: lockstep, the mean length", "engine", [params(mean)], None),
        ("Engine: own lengths", "engine", each, None),
        ("Engine: own lengths, refills at once", "engine, refills at once", each, None),
        ("Engine: own lengths, waves held without bound", "engine, waves held without bound", each, None),
    ]
    # What an Engine row compares with: the same load in one call.
    in_a_call = {"Engine: lockstep, the mean length": "lockstep, the mean length"}
    if args.loads:
        words = args.loads.split(",")
        loads = [load for load in loads
                 if load[0] in ("lockstep, the mean length", "own lengths") or any(w in load[0] for w in words)]
    # The second context (one KV buffer for all slots) and the engines only where a load needs them.
    unified = None
    if any(where is True for _, where, *_ in loads):
        unified = fastpar.Context(model, n_parallel=args.slots, n_ctx_per_seq=n_ctx_per_seq, kv_unified=True)
        unified._ctx.generate(texts[:args.slots], [params(32)], None)  # warm-up
    engines = {}
    for where in sorted({where for _, where, *_ in loads if isinstance(where, str)}):
        cp = _context_params(args.slots, n_ctx_per_seq, None, None, False)
        if where == "engine" and args.n_gpu_layers != 0:  # the Engine as shipped
            engines[where] = _core.Engine(model._model, cp, args.prompts)
        else:  # on the CPU too, a GPU's rules
            rules = _testing.streaming_step_policy(policy())
            if where == "engine, refills at once":
                rules.refill_wave = 0
            elif where == "engine, waves held without bound":
                rules.max_wave_hold = _testing.UNLIMITED_WAVE_HOLD
            engines[where] = _testing.engine_with_policy(model._model, cp, args.prompts, rules)
        run_on_engine(engines[where], texts[:args.slots], [params(32)])  # warm-up
    results = {"what": "outputs of different lengths under each GPU step rule",
               "machine": f"{platform.machine()}, {os.cpu_count()} cores",
               "model": os.path.basename(args.model), "prompts": args.prompts, "slots": args.slots,
               "workload": args.workload, "n_ctx_per_seq": n_ctx_per_seq, "refill_wave": policy().refill_wave,
               "mean_length": mean, "gen_tokens": sum(lengths), "loads": []}
    walls: dict = {name: [] for name, *_ in loads}
    last: dict = {}
    reference = None  # the own lengths' outputs under the context's rules
    for rep in range(args.reps):
        for name, where, p, pol in loads:
            t0 = time.perf_counter()
            if isinstance(where, str):
                out, stats = run_on_engine(engines[where], texts, p)
            else:
                c = unified if where else ctx
                out = _testing.generate_with_policy(c._ctx, texts, p, pol)
                stats = c.last_stats
            walls[name].append(round(time.perf_counter() - t0, 3))
            tokens = [list(o.token_ids) for o in out] if p is each else None
            if name == "own lengths" and reference is None:
                reference = tokens
            last[name] = (stats, tokens)
            print(json.dumps({"rep": rep, "load": name, "wall_s": walls[name][-1]}), flush=True)
    lock_rate = None
    # The lockstep load's calls are waves of a prompt part and `mean` generation calls.
    n_waves = -(-args.prompts // args.slots)
    first_wave_calls = max(0, last["lockstep, the mean length"][0].n_decode_calls // n_waves - mean)
    for name, where, p, pol in loads:
        (s, tokens), wall = last[name], statistics.median(walls[name])
        rate = s.n_gen_tokens / wall
        if name == "lockstep, the mean length":
            lock_rate = rate
        row = {"load": name, "wall_s": walls[name], "median_wall_s": wall, "gen_tok_s": round(rate, 1),
               "x_lockstep": round(rate / lock_rate, 3) if lock_rate else None,
               "decode_calls": s.n_decode_calls, "ms_per_call": round(1000 * wall / s.n_decode_calls, 2),
               "padding_tokens": s.n_padding_tokens, "gen_tokens": s.n_gen_tokens,
               "same_outputs": sum(a == b for a, b in zip(reference, tokens)) if tokens and reference else None}
        if p is each and where is False:  # the tail's share: see fifo_calls
            ordered = sorted(lengths, reverse=True) if pol.longest_first else lengths
            row["fifo_calls"] = fifo_calls(ordered, args.slots, pol.refill_wave, first_wave_calls)
        if isinstance(where, str):
            same = in_a_call.get(name, "own lengths")
            if same in walls:
                row["x_in_a_call"] = round(rate / (last[same][0].n_gen_tokens / statistics.median(walls[same])), 3)
        results["loads"].append(row)
        print(json.dumps(row), flush=True)
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
