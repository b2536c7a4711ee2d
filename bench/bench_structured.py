#!/usr/bin/env python3
"""Structured output against the same prompts unconstrained, in one run.

32 extraction prompts (chat), one 5-field JSON schema (a string enum, an integer with
bounds, a string with maxLength, a boolean, an array of strings), the default model on the
CPU at 8 and 32 slots; generation tokens/s constrained over unconstrained (bar: >= 0.8).
Each slot count is measured --repeats times, each time on a new context, in this order:
unconstrained, the context's first constrained call (cold: `ratio`, the schema compiled and
its allowed-token sets computed as they are needed), a second one (warm: `ratio_warm`, the
context kept both), and the matched load; each ratio is the median of the repetitions'. The
unconstrained runs generate --max-tokens each (ignore_eos on a GPU), a lockstep load;
`ratio_matched` and `ratio_matched_warm` compare against the same prompts unconstrained,
each generating as many tokens as its constrained output did (the same work in the same
shape: slots refilled as outputs of different lengths end). `unconstrained_mean_length`:
every prompt generating the constrained outputs' mean length, a lockstep load of about the
same work, which separates what outputs of different lengths cost (slots refilled, or idle
at the end, as outputs end) from what the constraint costs (`ratio_mixed_lengths`: matched
over mean-length tokens/s). Also what the constraint costs alone
(fastpar._testing.measure_grammar).

    python bench/bench_structured.py [--out bench/results/cpu-x86_64-2core-structured.json]
    python bench/bench_structured.py --gpu --model SPEED_MODEL.gguf --slots 256 --prompts 1024
    python bench/bench_structured.py --fuzz 1000     # random schemas and grammars, one process
    python bench/bench_structured.py --constraint choice    # or regex, tools: the same prompts and ratios
    python bench/bench_structured.py --classify 10000       # a classification job with choice

--constraint choice asks for one of the schema's categories, --constraint regex for a
"category, priority N: summary." line (REGEX), --constraint tools for a forced call of a
function whose parameters are the schema (tool_choice "required"; the default model's
template has no tools, so the generic format: a system message lists the function, and
both sides of each ratio get that rendered prompt), on the same tickets, measured as above.
--classify N: N tickets asked for their category, greedy with `choice` on 32 slots, against
the same prompts unconstrained generating as many tokens each (ignore_eos); prints the wall
times, their ratio and how many outputs are outside the labels (must be 0).

--gpu offloads every layer (bar: >= 0.7 at 256 slots with the speed model; its text is
noise, so most tokens take the grammar's mask, the worst case).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import time

import fastpar
from fastpar import _core, _testing

ROOT = pathlib.Path(__file__).resolve().parent.parent

sys.path.insert(0, str(ROOT / "tests"))
from extraction_task import TICKET_SCHEMA as SCHEMA, TICKETS  # noqa: E402 - the tests' task


LABELS = SCHEMA["properties"]["category"]["enum"]
REGEX = r"(bug|feature|question), priority [1-5]: [a-z][a-z ,']{9,59}\."


def ticket_text(i: int) -> str:
    return (f"Ticket #{i}: {TICKETS[i % len(TICKETS)]}. "
            "Answer with the ticket's category, priority, summary, urgency and tags as JSON.")


def prompts(n: int):
    return [[_core.ChatMessage("user", ticket_text(i))] for i in range(n)]


def run(ctx, ps, p):
    """One call: `p` is one GenerateParams for every prompt, or a list with one each."""
    t0 = time.perf_counter()
    out = ctx._ctx.generate(ps, p if isinstance(p, list) else [p], None)
    wall = time.perf_counter() - t0
    s = ctx.last_stats
    return {"gen_tokens": s.n_gen_tokens, "gen_tokens_per_s": round(s.gen_tokens_per_s, 1),
            "wall_s": round(wall, 2), "sample_ms": round(s.t_sample_ms, 1),
            "errors": sum(c.finish_reason == "error" for c in out),
            "stopped": sum(c.finish_reason == "stop" for c in out),
            # Constrained tokens by how each was chosen (docs/api.md, Stats).
            "grammar": {k: getattr(s, "n_grammar_" + k) for k in ("kept", "top", "wider", "whole", "cached")},
            "lengths": [c.n_gen_tokens for c in out]}


def classify(model, n: int) -> int:
    """n tickets asked for their category with `choice`, against the same prompts
    unconstrained, each generating as many tokens as its constrained answer (ignore_eos)."""
    ps = [[_core.ChatMessage("user", f"Ticket #{i}: {TICKETS[i % len(TICKETS)]}. "
                             f"Which category is it: {', '.join(LABELS)}? Answer with one word.")] for i in range(n)]
    choose = _core.GenerateParams()
    choose.max_tokens, choose.temperature, choose.choice = 8, 0.0, LABELS
    ctx = fastpar.Context(model, n_parallel=32, n_ctx_per_seq=256)
    run(ctx, ps[:32], choose)  # warm-up: the grammar compiled, its sets started
    t0 = time.perf_counter()
    out = ctx._ctx.generate(ps, [choose], None)
    wall = time.perf_counter() - t0
    outside = sum(c.text not in LABELS for c in out)
    counts = {label: sum(c.text == label for c in out) for label in LABELS}
    matched = []
    for c in out:
        m = _core.GenerateParams()
        m.max_tokens, m.temperature, m.ignore_eos = max(1, c.n_gen_tokens), 0.0, True
        matched.append(m)
    t0 = time.perf_counter()
    ctx._ctx.generate(ps, matched, None)
    wall_plain = time.perf_counter() - t0
    print(json.dumps({"prompts": n, "slots": 32, "outside_labels": outside, "labels": counts,
                      "errors": sum(c.finish_reason == "error" for c in out), "wall_s": round(wall, 1),
                      "unconstrained_matched_wall_s": round(wall_plain, 1),
                      "ratio": round(wall_plain / wall, 3)}))
    return 0 if outside == 0 else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu", action="store_true", help="every layer on the GPU")
    ap.add_argument("--model", default=None, help="GGUF (default: the default model)")
    ap.add_argument("--slots", default=None, help="comma-separated slot counts (default 8,32; --gpu 256)")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3,
                    help="repetitions per slot count, each on a new context: unconstrained, its first constrained "
                         "call (cold: no compiled schema, no allowed-token sets), a second one (warm: the context "
                         "keeps both), and the matched unconstrained load; medians are reported")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    ap.add_argument("--without-sets", action="store_true",
                    help="also run constrained with the shared allowed-token sets off (as before they existed)")
    ap.add_argument("--fuzz", type=int, default=0, help="instead: this many random schemas and grammars")
    ap.add_argument("--constraint", choices=("schema", "choice", "regex", "tools"), default="schema",
                    help="the constraint measured: the JSON schema, its categories as choice, REGEX, or a "
                         "forced tool call with the schema as parameters")
    ap.add_argument("--classify", type=int, default=0, help="instead: a classification job of this many prompts")
    args = ap.parse_args()

    if args.fuzz:
        script = ROOT / "tests" / "structured_fuzz.py"
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, str(script), "20240", str(args.fuzz), "24"], capture_output=True, text=True)
        print(f"fuzz: {args.fuzz} cases, exit status {r.returncode}, {time.perf_counter() - t0:.0f} s")
        print(r.stdout.strip())
        if r.returncode != 0:
            print(r.stderr[-3000:])
        return r.returncode

    model = fastpar.Model(args.model or fastpar.default_model_path(), n_gpu_layers=-1 if args.gpu else 0)
    if args.classify:
        return classify(model, args.classify)
    slots = [int(s) for s in (args.slots or ("256" if args.gpu else "8,32")).split(",")]
    ps = prompts(args.prompts)
    plain = _core.GenerateParams()
    plain.max_tokens, plain.temperature, plain.seed = args.max_tokens, 0.0, 1
    if args.gpu:
        plain.ignore_eos = True  # the speed model's text is noise
    constrained = _core.GenerateParams()
    for name in ("max_tokens", "temperature", "seed", "ignore_eos"):
        setattr(constrained, name, getattr(plain, name))
    constrained.ignore_eos = False  # a finished grammar allows only the end
    if args.constraint == "choice":
        constrained.choice = LABELS
    elif args.constraint == "regex":
        constrained.regex = REGEX
    elif args.constraint == "tools":
        tool = {"type": "function", "function": {"name": "file_ticket", "description": "File a support ticket",
                                                 "parameters": SCHEMA}}
        rendered = [model._model.render_chat(json.dumps([{"role": "user", "content": ticket_text(i)}]),
                                              json.dumps([tool]), "required", False) for i in range(args.prompts)]
        ps = [r.prompt for r in rendered]  # the tools' system message for both sides of a ratio
        constrained.grammar, constrained.grammar_prefill = rendered[0].grammar, rendered[0].grammar_prefill
        constrained.tool_parser = rendered[0].parser
    else:
        constrained.json_schema = json.dumps(SCHEMA)

    # A text the constraint accepts, fed token by token to measure a mask's cost.
    sample = model._model.tokenize({"schema": '{"category": "bug", "priority": 2, "summary": "app crashes on save", '
                                              '"urgent": true, "tags": ["crash", "save"]}',
                                    "choice": "feature", "regex": "bug, priority 2: app crashes on save.",
                                    "tools": '{"tool_call": {"name": "file_ticket", "arguments": {"category": "bug", '
                                             '"priority": 2, "summary": "app crashes on save", "urgent": true, '
                                             '"tags": ["crash", "save"]}}}'}[args.constraint])
    costs = _testing.measure_grammar(model._model, constrained, sample)
    what = {"schema": "5-field JSON schema", "choice": f"choice of {LABELS}", "regex": f"regex {REGEX}",
            "tools": "a forced tool call (generic format) with the 5-field schema as parameters"}
    results = {"what": f"structured output: {what[args.constraint]} vs the same prompts unconstrained",
               "machine": f"{platform.machine()}, {os.cpu_count()} cores", "gpu": args.gpu,
               "model": os.path.basename(args.model or fastpar.default_model_path()),
               "n_vocab": model._model.n_vocab, "prompts": args.prompts, "max_tokens": args.max_tokens,
               "grammar_costs_ms": {k: round(v, 4) for k, v in costs.items()}, "runs": []}
    print("grammar costs:", results["grammar_costs_ms"])
    def matched_params(lengths):
        # The same prompts unconstrained, each generating as many tokens as its constrained
        # output did: the same work in the same shape (outputs of different lengths make
        # continuous batching refill slots as they end), so the ratio is the constraint's cost.
        out = []
        for n_tokens in lengths:
            m = _core.GenerateParams()
            for name in ("temperature", "seed"):
                setattr(m, name, getattr(plain, name))
            m.max_tokens, m.ignore_eos = max(1, n_tokens), True
            out.append(m)
        return out

    def ratio(a, b):
        return round(a["gen_tokens_per_s"] / b["gen_tokens_per_s"], 3)

    for n in slots:
        reps = []
        for _ in range(args.repeats):
            # A new context each repetition: its first constrained call is cold (no compiled
            # schema, no allowed-token sets), the next one warm (the context keeps both).
            ctx = fastpar.Context(model, n_parallel=n, n_ctx_per_seq=512)
            run(ctx, ps[: min(n, len(ps))], plain)  # warm-up
            rep = {"unconstrained": run(ctx, ps, plain), "constrained": run(ctx, ps, constrained),
                   "constrained_warm": run(ctx, ps, constrained)}
            if args.without_sets:
                _testing.set_allowed_sets(ctx._ctx, False)
                try:
                    rep["constrained_without_sets"] = run(ctx, ps, constrained)
                finally:
                    _testing.set_allowed_sets(ctx._ctx, True)
            lengths = rep["constrained"]["lengths"]
            rep["unconstrained_matched"] = run(ctx, ps, matched_params(lengths))
            mean = round(sum(lengths) / len(lengths))
            rep["unconstrained_mean_length"] = run(ctx, ps, matched_params([mean] * len(lengths)))
            for r in rep.values():
                r.pop("lengths")
            rep["ratios"] = {"ratio": ratio(rep["constrained"], rep["unconstrained"]),
                             "ratio_warm": ratio(rep["constrained_warm"], rep["unconstrained"]),
                             "ratio_matched": ratio(rep["constrained"], rep["unconstrained_matched"]),
                             "ratio_matched_warm": ratio(rep["constrained_warm"], rep["unconstrained_matched"]),
                             "ratio_mixed_lengths": ratio(rep["unconstrained_matched"], rep["unconstrained_mean_length"])}
            if args.without_sets:
                rep["ratios"]["ratio_without_sets"] = ratio(rep["constrained_without_sets"], rep["unconstrained"])
            print(json.dumps({"slots": n, **rep["ratios"]}), flush=True)
            del ctx
            reps.append(rep)
        # Each kind's median run (by tokens/s); each ratio the median of the repetitions'.
        row = {"slots": n, "repeats": len(reps)}
        for kind in [k for k in reps[0] if k != "ratios"]:
            row[kind] = sorted((r[kind] for r in reps), key=lambda x: x["gen_tokens_per_s"])[len(reps) // 2]
        for key in reps[0]["ratios"]:
            row[key] = statistics.median(r["ratios"][key] for r in reps)
        row["ratios_by_repeat"] = [r["ratios"] for r in reps]
        results["runs"].append(row)
        print(json.dumps({k: v for k, v in row.items() if not isinstance(v, dict)}))
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
