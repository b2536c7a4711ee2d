"""Which backend runs, where tokens are sampled, and log-probabilities.

With FASTPAR_TEST_N_GPU_LAYERS=-1 (a CUDA build) the model is wholly on the GPU: rows of
logits are then cut down there by default (device sampling), inside llama.cpp's graph.
device_sampling=True does the same on the CPU, which lets these tests check it anywhere.
"""

from __future__ import annotations

import math

import pytest

import fastpar
from conftest import ON_GPU, PROMPTS, assert_clean


def test_backend_is_reported_in_the_stats(model):
    ctx = fastpar.Context(model, n_parallel=2, n_ctx_per_seq=128)
    fastpar.generate_parallel(ctx, PROMPTS[:2], max_tokens=4, temperature=0.0)
    reported = ctx.last_stats.backend
    assert reported in ("cpu", "cuda", "metal") and reported == fastpar.backend()
    assert ctx.last_stats.to_dict()["backend"] == reported
    # The name must match what the build can do: only a GPU build takes GPU layers.
    if reported == "cpu":
        with pytest.raises(ValueError, match="without a GPU backend"):
            fastpar.Model(model.path, n_gpu_layers=1)
    else:
        on_gpu = fastpar.Model(model.path, n_gpu_layers=1)
        gpu_ctx = fastpar.Context(on_gpu, n_parallel=1, n_ctx_per_seq=64)
        assert fastpar.generate_parallel(gpu_ctx, PROMPTS[:1], max_tokens=2)[0].n_gen_tokens == 2
        assert gpu_ctx.last_stats.backend == reported


def test_n_parallel_above_llama_cpp_limit_is_a_clear_error(model):
    with pytest.raises(ValueError, match="n_parallel must be between 1 and 256"):
        fastpar.Context(model, n_parallel=257, n_ctx_per_seq=64)


def test_default_n_batch_follows_the_backend_and_n_parallel(model):
    # 512 on the CPU, 2048 with layers on a GPU (fewer, larger prompt batches), and never
    # below n_parallel; an explicit n_batch is kept as given.
    base = 2048 if ON_GPU else 512
    assert fastpar.Context(model, n_parallel=4, n_ctx_per_seq=64).n_batch == base
    assert fastpar.Context(model, n_parallel=4, n_ctx_per_seq=64, n_batch=96).n_batch == 96
    if not ON_GPU:
        assert fastpar.Context(model, n_parallel=256, n_ctx_per_seq=8, warmup=False).n_batch == 512
    # A prompt longer than the physical batch still goes through whole.
    ctx = fastpar.Context(model, n_parallel=2, n_ctx_per_seq=base + 64)
    text = " ".join(["tokens"] * (base + 8))
    res = fastpar.generate_parallel(ctx, [text, "Hi"], max_tokens=2, temperature=0.0, ignore_eos=True)
    assert res[0].finish_reason == "length" and res[0].n_prompt_tokens > base
    assert ctx.last_stats.n_decode_calls >= 3
    assert_clean(ctx)


@pytest.mark.skipif(ON_GPU, reason="the model is on the GPU in this run")
def test_model_on_the_cpu_samples_on_the_host(model):
    ctx = fastpar.Context(model, n_parallel=8, n_ctx_per_seq=128)
    assert ctx.device_sampling is False
    results = fastpar.generate_parallel(ctx, PROMPTS, max_tokens=8, temperature=0.0)
    assert all(c.n_gen_tokens > 0 for c in results)
    assert ctx.last_stats.n_device_sampled == 0


@pytest.mark.parametrize("opts", [dict(temperature=0.0), dict(temperature=0.8, top_k=40, top_p=0.95, seed=5),
                                  dict(temperature=1.2, top_k=64, top_p=1.0, min_p=0.1, seed=9)],
                         ids=["greedy", "typical", "top-k-64"])
def test_device_sampling_picks_what_host_sampling_picks(model, opts):
    # Device sampling cuts each row of logits down to its best blocks inside llama.cpp's
    # graph (on the CPU in a CPU build); the chain then runs on those candidates. With the
    # same batches (same logits) it must pick exactly the tokens the whole rows give.
    on_device = fastpar.Context(model, n_parallel=8, n_ctx_per_seq=128, device_sampling=True)
    on_host = fastpar.Context(model, n_parallel=8, n_ctx_per_seq=128, device_sampling=False)
    assert on_device.device_sampling is True and on_host.device_sampling is False
    a = fastpar.generate_parallel(on_device, PROMPTS, max_tokens=24, ignore_eos=True, **opts)
    b = fastpar.generate_parallel(on_host, PROMPTS, max_tokens=24, ignore_eos=True, **opts)
    assert [c.token_ids for c in a] == [c.token_ids for c in b]
    assert on_device.last_stats.n_device_sampled == on_device.last_stats.n_gen_tokens == 8 * 24
    assert on_host.last_stats.n_device_sampled == 0
    # A second call reuses the attached device-sampling chains (and the slots are clean).
    again = fastpar.generate_parallel(on_device, PROMPTS, max_tokens=24, ignore_eos=True, **opts)
    assert [c.token_ids for c in again] == [c.token_ids for c in a]
    assert_clean(on_device)


def test_device_sampling_reads_rows_from_grouped_and_split_passes(model):
    # When one forward pass holds every row a step asks for, the rows come back grouped
    # (one copy for several rows, device_sampling.hpp); when a step is split into several
    # passes (prompt chunks next to decoding slots, a small n_batch), some are not. Both
    # kinds, and steps that switch between them, must read each sequence's own row.
    prompts = [f"{p} {' and then'.join([''] * (i % 4))}".strip() for i, p in enumerate(PROMPTS * 5)]
    tokens = {}
    for device in (True, False):
        ctx = fastpar.Context(model, n_parallel=len(prompts), n_ctx_per_seq=64, n_batch=64, device_sampling=device)
        results = fastpar.generate_parallel(ctx, prompts, max_tokens=10, ignore_eos=True, temperature=0.0)
        tokens[device] = [c.token_ids for c in results]
        assert ctx.last_stats.n_device_sampled == (len(prompts) * 10 if device else 0)
    assert tokens[True] == tokens[False]


def test_device_sampling_gives_whole_rows_to_chains_that_need_them(model):
    # Penalties, logprobs and top-k beyond the candidates need whole rows of logits: those
    # requests detach the slot's device-sampling chain, and later requests attach it again, in one engine.
    kinds = [dict(temperature=0.0), dict(temperature=0.0, logprobs=True), dict(temperature=0.0, repeat_penalty=1.3),
             dict(temperature=0.7, top_k=0, top_p=0.9, min_p=0.0, seed=4), dict(temperature=0.7, top_k=200, seed=4),
             dict(temperature=0.7, top_k=20, seed=4)]
    requests = [(PROMPTS[i % len(PROMPTS)], kinds[i % len(kinds)]) for i in range(18)]
    answers = {}
    for device in (True, False):
        with fastpar.Engine(model, n_parallel=4, n_ctx_per_seq=128, device_sampling=device) as engine:
            futures = [engine.submit(p, max_tokens=12, ignore_eos=True, **k) for p, k in requests]
            answers[device] = [f.result() for f in futures]
    for on_device, on_host, (_, k) in zip(answers[True], answers[False], requests):
        assert on_device.finish_reason == on_host.finish_reason == "length"
        assert len(on_device.logprobs) == (12 if k.get("logprobs") else 0)
        if not ON_GPU:
            # Continuous batching: batch-mates differ between the two runs, which on the CPU
            # leaves the logits (and so the tokens) as they are.
            assert on_device.token_ids == on_host.token_ids, k


@pytest.mark.skipif(not ON_GPU, reason="needs the model on a GPU (FASTPAR_TEST_N_GPU_LAYERS=-1, CUDA build)")
def test_device_sampling_is_the_default_on_a_gpu(model):
    assert fastpar.Context(model, n_parallel=8, n_ctx_per_seq=128).device_sampling is True


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
