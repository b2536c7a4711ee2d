"""A context's warm-up decodes at creation (``warmup``): they leave no trace in the slots
or in what the calls generate. Auto runs them only with layers on a GPU; the tests force
them on the CPU, where they run the same code."""

from __future__ import annotations

import pytest

import fastpar
from conftest import ON_GPU, PROMPTS, assert_clean


def test_auto_warms_up_only_with_layers_on_a_gpu(model):
    assert fastpar.Context(model, n_parallel=2, n_ctx_per_seq=64).warmed_up is ON_GPU
    assert fastpar.Context(model, n_parallel=2, n_ctx_per_seq=64, warmup=False).warmed_up is False


@pytest.mark.parametrize("device_sampling", [False, True], ids=["host", "device"])
@pytest.mark.parametrize("opts", [dict(temperature=0.0), dict(temperature=0.8, top_k=40, top_p=0.95, seed=3)],
                         ids=["greedy", "typical"])
def test_warm_context_generates_what_a_cold_one_does(model, device_sampling, opts):
    # Same batch shapes in both calls, so the same logits: any difference would be state
    # the warm-up left behind (KV cells, positions, sampler state).
    warm = fastpar.Context(model, n_parallel=8, n_ctx_per_seq=96, device_sampling=device_sampling, warmup=True)
    cold = fastpar.Context(model, n_parallel=8, n_ctx_per_seq=96, device_sampling=device_sampling, warmup=False)
    assert warm.warmed_up and not cold.warmed_up
    assert_clean(warm)  # every slot empty before the first call
    a = fastpar.generate_parallel(warm, PROMPTS, max_tokens=24, ignore_eos=True, **opts)
    b = fastpar.generate_parallel(cold, PROMPTS, max_tokens=24, ignore_eos=True, **opts)
    assert [c.token_ids for c in a] == [c.token_ids for c in b]
    assert all(c.n_prompt_tokens > 0 and c.n_gen_tokens == 24 for c in a)
    assert warm.last_stats.n_prompt_tokens == cold.last_stats.n_prompt_tokens
    assert warm.last_stats.n_device_sampled == cold.last_stats.n_device_sampled
    assert_clean(warm)


def test_warm_up_fits_every_slot_count_and_context_size(model):
    # One slot with a full physical batch of prompt positions; many slots with one each;
    # the smallest slot that holds a call's shape (3 positions).
    for n_parallel, n_ctx_per_seq in [(1, 600), (1, 3), (64, 8), (33, 16)]:
        ctx = fastpar.Context(model, n_parallel=n_parallel, n_ctx_per_seq=n_ctx_per_seq, warmup=True)
        assert ctx.warmed_up, (n_parallel, n_ctx_per_seq)
        assert_clean(ctx)
        (c,) = fastpar.generate_parallel(ctx, [PROMPTS[0]], max_tokens=1, temperature=0.0)
        assert c.n_gen_tokens == 1 or c.finish_reason == "error", c
    # Two positions a slot hold no call-shaped decode: nothing runs, and the context works.
    small = fastpar.Context(model, n_parallel=2, n_ctx_per_seq=2, warmup=True)
    assert small.warmed_up is False
    assert_clean(small)


def test_engine_takes_warmup(model):
    with fastpar.Engine(model, n_parallel=4, n_ctx_per_seq=96, warmup=True) as engine:
        c = engine.submit(PROMPTS[0], max_tokens=8, temperature=0.0).result()
    assert c.n_gen_tokens == 8


def test_warmup_must_be_a_bool(model):
    with pytest.raises(TypeError, match="warmup"):
        fastpar.Context(model, n_parallel=2, n_ctx_per_seq=64, warmup="yes")
