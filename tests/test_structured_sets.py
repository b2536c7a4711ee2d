"""Allowed-token sets shared by grammar state (core/structured/allowed_sets.*, docs/internals.md):
outputs are those of masking with each row's grammar alone, and rows in one state reuse a
set computed once."""

from __future__ import annotations

import json

import pytest

import fastpar
from fastpar import _testing

from test_structured_output import TICKET_SCHEMA, TICKETS, chat, params


@pytest.fixture(scope="module")
def ctx(model: fastpar.Model) -> fastpar.Context:
    return fastpar.Context(model, n_parallel=8, n_ctx_per_seq=512)


def counts(stats) -> dict:
    return {k: getattr(stats, "n_grammar_" + k) for k in ("kept", "top", "wider", "whole", "cached")}


def run(ctx, prompts, p):
    out = ctx._ctx.generate(prompts, [p], None)
    return [(c.text, c.finish_reason, list(c.token_ids)) for c in out], counts(ctx.last_stats)


def with_and_without_sets(ctx, prompts, p):
    """run() with the context's allowed-token sets on, then off (its grammar cache's
    option, the oracle): (outputs, counts) of each."""
    assert _testing.allowed_sets(ctx._ctx)
    on = run(ctx, prompts, p)
    _testing.set_allowed_sets(ctx._ctx, False)
    try:
        assert not _testing.allowed_sets(ctx._ctx)
        off = run(ctx, prompts, p)
    finally:
        _testing.set_allowed_sets(ctx._ctx, True)
    return on, off


# top_k=0: a refused token needs a whole mask (no staged search), so refusals go through the sets.
CASES = {
    "greedy": dict(temperature=0.0),
    "seeded_top_k": dict(temperature=0.9, top_k=40, seed=11),
    "seeded_whole_row": dict(temperature=1.3, top_k=0, top_p=1.0, seed=5),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_outputs_equal_without_sets(ctx, case):
    prompts = [chat(f"Ticket: {TICKETS[i % len(TICKETS)]} (#{i}). Answer as JSON.") for i in range(8)]
    p = params(max_tokens=28, json_schema=json.dumps(TICKET_SCHEMA), **CASES[case])
    (with_sets, used), (without, plain) = with_and_without_sets(ctx, prompts, p)
    assert with_sets == without
    assert used["kept"] == plain["kept"]  # the chain's own choices were checked alike
    assert plain["cached"] == 0
    if case == "seeded_whole_row":
        # Refused rows read sets there (computed once each); without them, every one masks whole.
        assert used["cached"] + used["whole"] == plain["whole"] > 0
        assert used["cached"] > 0


def test_greedy_refusals_read_large_sets(ctx):
    # Text without the letter e: one state that allows most of the vocabulary (a set too
    # large to list its tokens) and refuses the model's own choice often. Whole-row
    # sampling computes that set; greedy rows refused later choose from it in one pass,
    # the token that masking with the grammar alone gives.
    g = r"root ::= [^eE\x00-\x1f]+"
    prompts = [chat(f"Describe ticket #{i} in detail: {TICKETS[i % len(TICKETS)]}") for i in range(8)]
    run(ctx, prompts, params(max_tokens=8, temperature=1.3, top_k=0, top_p=1.0, seed=5, grammar=g))
    greedy = params(max_tokens=40, temperature=0.0, grammar=g)
    (with_sets, used), (without, plain) = with_and_without_sets(ctx, prompts, greedy)
    assert with_sets == without
    assert all("e" not in text.lower() for text, _, _ in with_sets)
    assert used["cached"] > 0 and plain["cached"] == 0


def test_many_rows_on_one_schema_share_sets(model):
    ctx = fastpar.Context(model, n_parallel=16, n_ctx_per_seq=256)
    prompts = [chat(f"Ticket #{i}: {TICKETS[i % len(TICKETS)]}. Answer as JSON.") for i in range(32)]
    p = params(max_tokens=24, temperature=1.5, top_k=0, top_p=1.0, seed=3, json_schema=json.dumps(TICKET_SCHEMA))
    out = ctx._ctx.generate(prompts, [p], None)
    s = ctx.last_stats
    c = counts(s)
    assert sum(c.values()) == s.n_gen_tokens == sum(len(x.token_ids) for x in out)
    assert c["wider"] == 0 and c["top"] == 0  # no staged search without top-k
    # 32 rows start in one state and walk the same keys: each state is masked once.
    assert c["cached"] > c["whole"] > 0
    assert c["kept"] > 0


def test_sets_last_across_calls(model):
    """A context keeps its compiled constraints and their sets: the same seeded call again
    walks the same states and masks none of them anew."""
    ctx = fastpar.Context(model, n_parallel=16, n_ctx_per_seq=256)
    prompts = [chat(f"Ticket #{i}: {TICKETS[i % len(TICKETS)]}. Answer as JSON.") for i in range(16)]
    p = params(max_tokens=24, temperature=1.5, top_k=0, top_p=1.0, seed=3, json_schema=json.dumps(TICKET_SCHEMA))
    first = ctx._ctx.generate(prompts, [p], None)
    a = counts(ctx.last_stats)
    second = ctx._ctx.generate(prompts, [p], None)
    b = counts(ctx.last_stats)
    assert [c.token_ids for c in second] == [c.token_ids for c in first]
    assert a["whole"] > 0 and b["whole"] == 0
    assert b["cached"] == a["cached"] + a["whole"] and b["kept"] == a["kept"]


def test_more_grammars_than_a_context_keeps(model):
    """Over kMaxCompiledGrammars distinct grammars in one call: the cache starts over while
    rows still hold their copies, and every row keeps its own constraint."""
    ctx = fastpar.Context(model, n_parallel=16, n_ctx_per_seq=64)
    n = 300
    out = fastpar.generate_parallel(ctx, ["Say something."] * n,
                                    [fastpar.SamplingParams(max_tokens=8, grammar=f'root ::= "w{i}z"') for i in range(n)])
    assert [c.text for c in out] == [f"w{i}z" for i in range(n)]
    again = fastpar.generate_parallel(ctx, ["Say something."] * 3,
                                      [fastpar.SamplingParams(max_tokens=8, grammar=f'root ::= "w{i}z"') for i in (0, 150, 299)])
    assert [c.text for c in again] == ["w0z", "w150z", "w299z"]


GRAMMARS = {
    "ticket_schema": dict(json_schema=json.dumps(TICKET_SCHEMA)),
    "nested_schema": dict(json_schema=json.dumps({
        "type": "object",
        "properties": {"name": {"type": "string", "pattern": "^[A-Z][a-z]{1,8}$"},
                       "items": {"type": "array", "items": {"type": "object", "properties": {
                           "n": {"type": "integer", "minimum": -50, "maximum": 50}, "ok": {"type": "boolean"}},
                           "required": ["n", "ok"]}, "maxItems": 4}},
        "required": ["name", "items"]})),
    # Characters outside ASCII, ranges and negations: partly decoded characters between tokens.
    "unicode_grammar": dict(grammar='root ::= "«" [^»\\x00-\\x1F]{0,30} "»" ("é" | [α-ω]+ | "日本語")* "."'),
    "free_text_grammar": dict(grammar='root ::= [^\\n]{0,60} "\\n"'),
}


@pytest.mark.parametrize("workers", [0, 3])
@pytest.mark.parametrize("name", sorted(GRAMMARS))
def test_whole_masks_match_llama_cpp(model, name, workers):
    # The sets' whole masks skip tokens whose prefix or first character was refused, read
    # each token's text decoded ahead, and after a partly decoded character read only the
    # tokens that can continue it; along random walks they must equal llama.cpp's mask of
    # every token, computed by one thread or, as on a GPU, by several together.
    p = params(**GRAMMARS[name])
    runs = [_testing.compare_masks(model._model, p, 40, seed, workers) for seed in (1, 2, 3)]
    for r in runs:
        assert r["n_states"] >= 2
        assert r["n_differ"] == 0, r
        assert r["n_compared"] == r["n_states"], r
    if name == "unicode_grammar":
        assert sum(r["n_partial"] for r in runs) > 0
