"""Isolation and order: a prompt's output does not depend on its batch-mates or its slot."""

from __future__ import annotations

import fastpar
from conftest import GREEDY, MORE_PROMPTS, PROMPTS, assert_clean


def test_isolation_batched_equals_alone(model, solo):
    ctx = fastpar.Context(model, n_parallel=8, n_ctx_per_seq=512)
    results = fastpar.generate_parallel(ctx, PROMPTS, max_tokens=48, **GREEDY)
    assert len(results) == len(PROMPTS)
    for prompt, c in zip(PROMPTS, results):
        assert c.finish_reason in ("stop", "length")
        assert c.n_gen_tokens > 0
        assert c.token_ids == solo(prompt), f"batched output differs from solo for {prompt!r}"
    # The eight prompts really are different work: not all outputs alike.
    assert len({tuple(c.token_ids) for c in results}) == len(PROMPTS)
    assert_clean(ctx)


def test_order_and_refill_more_prompts_than_slots(model, solo):
    assert len(MORE_PROMPTS) == 20
    ctx = fastpar.Context(model, n_parallel=4, n_ctx_per_seq=512)
    results = fastpar.generate_parallel(ctx, MORE_PROMPTS, max_tokens=48, **GREEDY)
    assert [c.token_ids for c in results] == [solo(p) for p in MORE_PROMPTS]
    assert ctx.last_stats.n_prompts == 20
    assert_clean(ctx)


def test_isolation_with_unified_kv(model, solo):
    ctx = fastpar.Context(model, n_parallel=8, n_ctx_per_seq=512, kv_unified=True)
    results = fastpar.generate_parallel(ctx, PROMPTS, max_tokens=48, **GREEDY)
    assert [c.token_ids for c in results] == [solo(p) for p in PROMPTS]
    assert_clean(ctx)


def test_long_prompt_fed_in_chunks_matches_unchunked(model):
    # n_batch=8 forces a 150-token prompt through 19+ decode calls (the scheduler
    # chunks it; llama.cpp would abort on a batch larger than n_batch).
    long_prompt = "Count the animals: " + ", ".join(["cat", "dog", "bird", "fish", "horse"] * 12) + ". In total there are"
    assert len(model.tokenize(long_prompt)) > 100
    prompts = [long_prompt, "The capital of France is"]
    small = fastpar.Context(model, n_parallel=2, n_ctx_per_seq=512, n_batch=8)
    big = fastpar.Context(model, n_parallel=2, n_ctx_per_seq=512, n_batch=512)
    chunked = fastpar.generate_parallel(small, prompts, max_tokens=16, ignore_eos=True, **GREEDY)
    whole = fastpar.generate_parallel(big, prompts, max_tokens=16, ignore_eos=True, **GREEDY)
    n_long = len(model.tokenize(long_prompt))
    assert small.last_stats.n_decode_calls >= -(-n_long // 8) + 15  # 8-token chunks, then one per token
    assert big.last_stats.n_decode_calls == 16  # the whole prompt in one call, then one per token
    assert [c.n_prompt_tokens for c in chunked] == [len(model.tokenize(p)) for p in prompts]
    assert [c.text for c in chunked] == [c.text for c in whole]
    assert_clean(small)
