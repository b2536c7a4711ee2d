"""Shared prefixes: prompts that start alike decode the common part once, and their output
is what each gives when it decodes everything itself."""

from __future__ import annotations

import fastpar
import pytest
from conftest import ON_GPU, assert_clean

# A shared preamble of about 60 tokens, then a different question for each prompt.
PREAMBLE = ("You are a careful assistant. Read the notes and answer in one short sentence. "
            "Notes: the red box is on the table, the blue box is under the bed, the green box "
            "is in the kitchen, and the yellow box was lost last year. ")
QUESTIONS = ["Where is the red box?", "Where is the blue box?", "Where is the green box?",
             "What happened to the yellow box?", "Which box is in the kitchen?", "How many boxes are there?"]
PROMPTS = [PREAMBLE + q for q in QUESTIONS]
OPTS = dict(max_tokens=16, temperature=0.0, logprobs=True, ignore_eos=True)
# Copied KV cells hold the very values the prompt would compute itself, but a sequence that
# shares runs beside different batch-mates in different steps, and llama.cpp's kernels round
# by batch shape (tests/conftest.py): compare each output with the prompt's solo run
# (n_parallel=1), log-probabilities up to the first parting token.
# With kv_unified=True a sequence's cells sit among other sequences' cells and its
# log-probabilities move further from the solo run's, with or without sharing (README,
# "Isolation, exactly"; measured here up to 0.009 after 15 tokens with sharing, up to 2 without).
TOL = 1.0 if ON_GPU else 1e-3
TOL_UNIFIED = 1.0 if ON_GPU else 0.05


@pytest.fixture(scope="module")
def solo_runs(model):
    ctx = fastpar.Context(model, n_parallel=1, n_ctx_per_seq=256)
    return fastpar.generate_parallel(ctx, PROMPTS, **OPTS)


def assert_close(got: fastpar.Completion, want: fastpar.Completion, what: str, tol: float = TOL) -> None:
    n = min(len(got.token_ids), len(want.token_ids))
    k = next((i for i in range(n) if got.token_ids[i] != want.token_ids[i]), n)
    worst = max((abs(got.logprobs[i] - want.logprobs[i]) for i in range(min(k + 1, n))), default=0.0)
    assert worst <= tol, f"{what}: log-probabilities differ by {worst} up to token {k}"


def prompt_lengths(model, prompts):
    return [len(model.tokenize(p)) for p in prompts]


def common_prefix(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@pytest.mark.parametrize("kv_unified", [False, True])
def test_shared_prefix_is_decoded_once(model, solo_runs, kv_unified):
    shared = fastpar.Context(model, n_parallel=len(PROMPTS), n_ctx_per_seq=256, kv_unified=kv_unified)
    alone = fastpar.Context(model, n_parallel=len(PROMPTS), n_ctx_per_seq=256, kv_unified=kv_unified,
                            share_prefixes=False)
    assert shared.share_prefixes and not alone.share_prefixes
    got = fastpar.generate_parallel(shared, PROMPTS, **OPTS)
    want = fastpar.generate_parallel(alone, PROMPTS, **OPTS)
    tokens = [model.tokenize(p) for p in PROMPTS]
    common = min(common_prefix(tokens[0], t) for t in tokens[1:])
    assert common >= 40
    # The first prompt decodes the preamble; every other one copies it.
    assert got[0].n_prompt_tokens_shared == 0
    for c in got[1:]:
        assert c.n_prompt_tokens_shared >= common - 1
    for c, n in zip(got, prompt_lengths(model, PROMPTS)):
        assert c.n_prompt_tokens + c.n_prompt_tokens_shared == n
        assert c.n_prompt_tokens >= 1  # the last prompt token is always decoded by its own slot
    s = shared.last_stats
    assert s.n_prompt_tokens_shared == sum(c.n_prompt_tokens_shared for c in got)
    assert s.n_prompt_tokens == sum(c.n_prompt_tokens for c in got)
    assert alone.last_stats.n_prompt_tokens_shared == 0
    assert alone.last_stats.n_prompt_tokens == sum(prompt_lengths(model, PROMPTS))
    for g, w, q in zip(got, solo_runs, QUESTIONS):
        assert_close(g, w, f"{q!r} with its prefix copied, and alone", TOL_UNIFIED if kv_unified else TOL)
    assert_clean(shared)
    assert_clean(alone)


def test_new_prompt_copies_prefix_from_a_running_one(model, solo_runs):
    # Two slots, six prompts: later prompts are admitted while others are generating and
    # copy the preamble from a slot that is already past its prompt.
    shared = fastpar.Context(model, n_parallel=2, n_ctx_per_seq=256)
    got = fastpar.generate_parallel(shared, PROMPTS, **OPTS)
    assert sum(c.n_prompt_tokens_shared > 0 for c in got) == len(PROMPTS) - 1
    for g, w, q in zip(got, solo_runs, QUESTIONS):
        assert_close(g, w, f"{q!r} refilled with a copied prefix")
    assert_clean(shared)


def test_identical_prompts_share_all_but_the_last_token(model, solo_runs):
    prompts = [PROMPTS[0]] * 4
    n = len(model.tokenize(PROMPTS[0]))
    ctx = fastpar.Context(model, n_parallel=4, n_ctx_per_seq=256)
    got = fastpar.generate_parallel(ctx, prompts, **OPTS)
    assert [c.n_prompt_tokens_shared for c in got] == [0] + [n - 1] * 3
    assert [c.n_prompt_tokens for c in got] == [n] + [1] * 3
    for c in got:
        assert_close(c, solo_runs[0], "an identical prompt with its prefix copied")
    assert_clean(ctx)


def test_short_common_prefixes_are_not_shared(model):
    # Prompts alike for fewer than 16 tokens decode everything themselves.
    prompts = ["The weather today is sunny and warm, so we", "The weather today is cold and wet, so we"]
    tokens = [model.tokenize(p) for p in prompts]
    assert 0 < common_prefix(*tokens) < 16
    ctx = fastpar.Context(model, n_parallel=2, n_ctx_per_seq=128)
    got = fastpar.generate_parallel(ctx, prompts, **OPTS)
    assert [c.n_prompt_tokens_shared for c in got] == [0, 0]
    assert ctx.last_stats.n_prompt_tokens == sum(len(t) for t in tokens)


def test_sharing_prompt_that_fails_leaves_the_others(model):
    # A prompt too long for its slot fails before it is decoded; the prompts that share
    # its preamble still get theirs, from each other.
    too_long = PREAMBLE + "word " * 300
    prompts = [too_long] + PROMPTS[:3]
    ctx = fastpar.Context(model, n_parallel=4, n_ctx_per_seq=128)
    got = fastpar.generate_parallel(ctx, prompts, **OPTS)
    assert got[0].finish_reason == "error" and "n_ctx_per_seq" in got[0].error
    assert all(c.finish_reason == "length" for c in got[1:])
    assert sum(c.n_prompt_tokens_shared > 0 for c in got[1:]) == 2
    assert_clean(ctx)


def test_engine_requests_share_prefixes(model, solo_runs):
    with fastpar.Engine(model, n_parallel=3, n_ctx_per_seq=256) as engine:
        handles = [engine.submit(p, **OPTS) for p in PROMPTS]
        got = [h.result(timeout=120) for h in handles]
        stats = engine.stats()
    for g, w, q in zip(got, solo_runs, QUESTIONS):
        assert_close(g, w, f"{q!r} through the engine")
    lengths = prompt_lengths(model, PROMPTS)
    assert stats.n_prompt_tokens + stats.n_prompt_tokens_shared == sum(lengths)
    assert stats.n_prompt_tokens_shared > 0
