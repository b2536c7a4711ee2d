"""Which backend runs, where tokens are sampled, and log-probabilities.

With FASTPAR_TEST_N_GPU_LAYERS=-1 (a CUDA build) the model is wholly on the GPU: tokens
are then sampled there by default, inside llama.cpp's graph.
"""

from __future__ import annotations

import math

import pytest

import fastpar
from conftest import ON_GPU, PROMPTS, assert_clean


def test_backend_is_reported_in_the_stats(model):
    assert fastpar.backend() in ("cpu", "cuda", "metal")
    ctx = fastpar.Context(model, n_parallel=2, n_ctx_per_seq=128)
    fastpar.generate_parallel(ctx, PROMPTS[:2], max_tokens=4, temperature=0.0)
    assert ctx.last_stats.backend == fastpar.backend()


def test_n_parallel_above_llama_cpp_limit_is_a_clear_error(model):
    with pytest.raises(ValueError, match="n_parallel must be between 1 and 256"):
        fastpar.Context(model, n_parallel=257, n_ctx_per_seq=64)


@pytest.mark.skipif(ON_GPU, reason="the model is on the GPU in this run")
def test_model_on_the_cpu_samples_on_the_host(model):
    ctx = fastpar.Context(model, n_parallel=8, n_ctx_per_seq=128)
    assert ctx.device_sampling is False
    results = fastpar.generate_parallel(ctx, PROMPTS, max_tokens=8, temperature=0.0)
    assert all(c.n_gen_tokens > 0 for c in results)
    assert ctx.last_stats.n_device_sampled == 0


@pytest.mark.skipif(not ON_GPU, reason="needs the model on a GPU (FASTPAR_TEST_N_GPU_LAYERS=-1, CUDA build)")
def test_device_sampling_picks_what_host_sampling_picks(model):
    on_device = fastpar.Context(model, n_parallel=8, n_ctx_per_seq=128, device_sampling=True)
    on_host = fastpar.Context(model, n_parallel=8, n_ctx_per_seq=128)
    assert on_device.device_sampling is True and on_host.device_sampling is False
    a = fastpar.generate_parallel(on_device, PROMPTS, max_tokens=24, temperature=0.0)
    b = fastpar.generate_parallel(on_host, PROMPTS, max_tokens=24, temperature=0.0)
    # Same batch shapes, same logits: the GPU's argmax and the host's agree.
    assert [c.token_ids for c in a] == [c.token_ids for c in b]
    assert on_device.last_stats.n_device_sampled == on_device.last_stats.n_gen_tokens > 0
    assert on_host.last_stats.n_device_sampled == 0
    # A second call reuses the attached samplers (and the slots are clean).
    again = fastpar.generate_parallel(on_device, PROMPTS, max_tokens=24, temperature=0.0)
    assert [c.token_ids for c in again] == [c.token_ids for c in a]
    assert_clean(on_device)


@pytest.mark.skipif(not ON_GPU, reason="needs the model on a GPU (FASTPAR_TEST_N_GPU_LAYERS=-1, CUDA build)")
def test_device_sampled_runs_repeat_and_follow_the_seed(model):
    ctx = fastpar.Context(model, n_parallel=8, n_ctx_per_seq=128, device_sampling=True)
    opts = dict(max_tokens=24, temperature=0.8, top_k=40, top_p=0.95, seed=7, ignore_eos=True)
    a = fastpar.generate_parallel(ctx, PROMPTS, **opts)
    b = fastpar.generate_parallel(ctx, PROMPTS, **opts)
    c = fastpar.generate_parallel(ctx, PROMPTS, **{**opts, "seed": 8})
    assert ctx.last_stats.n_device_sampled == ctx.last_stats.n_gen_tokens == 8 * 24
    assert [r.token_ids for r in a] == [r.token_ids for r in b]
    assert [r.token_ids for r in a] != [r.token_ids for r in c]


def test_logprobs_are_the_chosen_tokens_log_probabilities(model):
    ctx = fastpar.Context(model, n_parallel=4, n_ctx_per_seq=128)
    plain = fastpar.generate_parallel(ctx, PROMPTS[:4], max_tokens=16, temperature=0.0)
    scored = fastpar.generate_parallel(ctx, PROMPTS[:4], max_tokens=16, temperature=0.0, logprobs=True)
    assert ctx.last_stats.n_device_sampled == 0  # logprobs need the logits on the host
    n_vocab = model.n_vocab
    for p, s in zip(plain, scored):
        assert p.logprobs == []
        assert s.token_ids == p.token_ids  # same batch, same logits: same argmax, wherever it is taken
        assert len(s.logprobs) == s.n_gen_tokens > 0
        # A greedy token is the most likely one, so at least as likely as the uniform 1/n_vocab.
        assert all(-math.log(n_vocab) <= x <= 0.0 for x in s.logprobs), s.logprobs
    # Sampling at a high temperature picks tokens the model finds less likely than greedy does.
    hot = fastpar.generate_parallel(ctx, PROMPTS[:4], max_tokens=16, temperature=1.5, top_k=0, top_p=1.0,
                                    min_p=0.0, seed=3, ignore_eos=True, logprobs=True)
    mean = lambda cs: sum(sum(c.logprobs) for c in cs) / sum(len(c.logprobs) for c in cs)  # noqa: E731
    assert mean(hot) < mean(scored)
    assert_clean(ctx)
