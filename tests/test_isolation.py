"""Isolation and order: a prompt's output does not depend on its batch-mates or its slot."""

from __future__ import annotations

import pytest

import fastpar
from conftest import GREEDY, MORE_PROMPTS, ON_GPU, PROMPTS, assert_as_solo, assert_clean, assert_same_greedy


def greedy_params(budgets):
    """GenerateParams for generate_with_policy: greedy, with log-probabilities (compared on a
    GPU: conftest.py), one per budget."""
    from fastpar import _core

    params = []
    for m in budgets:
        p = _core.GenerateParams()
        p.max_tokens, p.temperature, p.logprobs = m, 0.0, True
        params.append(p)
    return params


def test_isolation_batched_equals_alone(model, solo):
    ctx = fastpar.Context(model, n_parallel=8, n_ctx_per_seq=512)
    results = fastpar.generate_parallel(ctx, PROMPTS, max_tokens=48, **GREEDY)
    assert len(results) == len(PROMPTS)
    for c in results:
        assert c.finish_reason in ("stop", "length")
        assert c.n_gen_tokens > 0
    assert_as_solo(results, PROMPTS, solo)
    # The eight prompts really are different work: not all outputs alike.
    assert len({tuple(c.token_ids) for c in results}) == len(PROMPTS)
    assert_clean(ctx)


def test_order_and_refill_more_prompts_than_slots(model, solo):
    assert len(MORE_PROMPTS) == 20
    ctx = fastpar.Context(model, n_parallel=4, n_ctx_per_seq=512)
    results = fastpar.generate_parallel(ctx, MORE_PROMPTS, max_tokens=48, **GREEDY)
    assert_as_solo(results, MORE_PROMPTS, solo)
    assert ctx.last_stats.n_prompts == 20
    assert_clean(ctx)


def test_a_call_admits_the_largest_max_tokens_first(model):
    """A call admits its prompts in order of max_tokens, largest first (StepPolicy::longest_first,
    stable; results in input order), so the longest outputs start at once instead of ending
    alone after the rest (internals.md, "A step"). Two slots, two prompts of 40 tokens around
    20 of 1 token: in the given order one slot runs the first 40 while the other takes the
    short ones one by one, then the last 40 runs alone; largest first, the two 40s run
    together, then the short ones in pairs: fewer calls, under a CPU's rules and a GPU's.
    Every output is the one it has with a slot each, and a plain call takes the rule."""
    from fastpar import _testing

    budgets = [40] + [1] * 20 + [40]
    prompts = [f"{MORE_PROMPTS[i % len(MORE_PROMPTS)]} ({i})" for i in range(len(budgets))]
    params = greedy_params(budgets)
    for p in params:
        p.ignore_eos = True
    each = [fastpar.SamplingParams(max_tokens=m, ignore_eos=True, **GREEDY) for m in budgets]
    want = fastpar.generate_parallel(fastpar.Context(model, n_parallel=len(budgets), n_ctx_per_seq=256), prompts, each)
    ctx = fastpar.Context(model, n_parallel=2, n_ctx_per_seq=256)
    calls = {}
    for gpu_rules in (False, True):
        for longest in (True, False):
            policy = _testing.resolve_step_policy(output_on_gpu=gpu_rules, kv_unified=False,
                                                  memory_copies_by_position=True, share_prefixes=True, n_parallel=2,
                                                  n_threads=ctx.n_threads)
            assert policy.longest_first  # the rule's default
            policy.longest_first = longest
            results = _testing.generate_with_policy(ctx._ctx, prompts, params, policy)
            assert [c.n_gen_tokens for c in results] == budgets
            for i, (c, w) in enumerate(zip(results, want)):
                assert_same_greedy(c, w, f"prompt {i}, gpu_rules={gpu_rules}, longest_first={longest}")
            assert_clean(ctx)
            calls[gpu_rules, longest] = ctx.last_stats.n_decode_calls
    for gpu_rules in (False, True):
        assert calls[gpu_rules, True] + 8 <= calls[gpu_rules, False], calls
    fastpar.generate_parallel(ctx, prompts, each)
    assert ctx.last_stats.n_decode_calls == calls[ON_GPU, True], (ctx.last_stats.n_decode_calls, calls)


def test_finished_slots_between_running_ones(model, solo):
    """Slots that finish early leave idle slots between running ones. llama.cpp runs only
    consecutive sequences in one forward pass, so on a GPU such steps are padded with a
    throw-away token per idle slot (removed right after), or the running sequences move down
    into the freed slots once nothing waits (test_running_sequences_move_into_freed_slots
    sets each rule apart); on the CPU neither happens. Either way each prompt's output is
    its solo output."""
    budgets = [2, 24] * 4
    with fastpar.Engine(model, n_parallel=8, n_ctx_per_seq=256) as engine:
        handles = [engine.submit(p, max_tokens=m, **GREEDY) for p, m in zip(PROMPTS, budgets)]
        results = [h.result(timeout=120) for h in handles]
        stats = engine.stats()
    for c, p, m in zip(results, PROMPTS, budgets):
        assert c.finish_reason in ("stop", "length"), c.error
        assert_same_greedy(c, solo(p, m), f"{p!r} beside finished slots")
    assert sum(c.n_gen_tokens > 2 for c in results) >= 2  # some really ran on past the others
    if not ON_GPU:
        assert stats.n_padding_tokens == 0


@pytest.mark.parametrize("device_sampling", [False, True])
def test_running_sequences_move_into_freed_slots(model, solo, device_sampling):
    """Under a GPU's rules, once nothing waits for a slot, the highest running sequences move
    down into slots freed below them (StepPolicy::compact_slots, a copy of the whole KV
    buffer): the steps after that have no gaps to pad. Run here with that rule off and on;
    each prompt's output is its solo output either way (on a GPU up to rounding, the moved
    sequence's row being another: conftest.py), every moved sequence takes its device-sampling
    chain along, and the cache ends clean. With the prefix cache, a slot in a gap holding a
    cached sequence is a target too: that sequence first moves to an empty slot (the cached
    context has one slot more than prompts, then those the moves leave); the second call
    finds every sequence where it went. (With none empty, a sequence the cache would save
    stays where it is: test_prefix_cache.py.)"""
    from fastpar import _testing

    ctx = fastpar.Context(model, n_parallel=8, n_ctx_per_seq=256, device_sampling=device_sampling)
    cached = fastpar.Context(model, n_parallel=9, n_ctx_per_seq=256, device_sampling=device_sampling,
                             prefix_cache_mib=-1)
    budgets = [2, 24, 3, 24, 24, 5, 2, 24]  # slots 0, 2, 5 and 6 end early: gaps below running ones
    # Prompts of 17-25 tokens: long enough for the cache to keep (kMinSharedPrefix).
    prompts = [f"{MORE_PROMPTS[19 - i]} {MORE_PROMPTS[8 + i]} {p} Go on, please." for i, p in enumerate(PROMPTS)]
    params = greedy_params(budgets)
    padding = {}
    # The cached context runs twice: the second call starts from the sequences the first left
    # in the slots, so a pad that had wiped one (the cache still counting it) would show.
    runs = ((ctx, False), (ctx, True), (cached, True), (cached, True))
    for i, (c, compact) in enumerate(runs):
        policy = _testing.resolve_step_policy(output_on_gpu=True, kv_unified=False, memory_copies_by_position=True,
                                              share_prefixes=True, n_parallel=c.n_parallel, n_threads=c.n_threads)
        assert policy.compact_slots and policy.max_padded_gap > 0
        policy.compact_slots = compact
        policy.equal_chunks = False  # the prompts differ in length: only gaps are counted here
        policy.longest_first = False  # slot i takes prompt i: the gaps are where the budgets put them
        results = _testing.generate_with_policy(c._ctx, prompts, params, policy)
        for r, prompt, m in zip(results, prompts, budgets):
            assert r.finish_reason == "length", r.error  # each runs to its budget: the gaps are as planned
            assert_same_greedy(r, solo(prompt, m), f"{prompt!r}, compact_slots={compact}")
        assert_clean(c)
        if i == 2:
            padding[(True, True)] = c.last_stats.n_padding_tokens
            # Every cached sequence moved aside on the device: none saved, none dropped.
            s = c.prefix_cache_stats()
            assert s.n_slots_held == 8 and s.n_saved == 0 and s.n_not_saved == 0, s
        elif i == 3:
            # What the first call left where it went is found: each prompt starts from all but
            # its last token (n_prompt_tokens: those decoded).
            assert all(r.n_prompt_tokens == 1 for r in results), \
                [(r.n_prompt_tokens, r.n_prompt_tokens_cached) for r in results]
            assert c.prefix_cache_stats().n_restored == 0
        else:
            padding[(False, compact)] = c.last_stats.n_padding_tokens
    # Without the rule the freed slots are padded for 19 steps or more; with it the running
    # ones move down at once, with the prefix cache too.
    assert padding[(False, False)] >= 19, padding
    assert padding[(False, True)] == 0, padding
    assert padding[(True, True)] == 0, padding


def test_refills_in_waves(model, solo):
    """Under a GPU's rules a batch call refills freed slots in waves (StepPolicy::refill_wave):
    while sequences run, waiting prompts take freed slots only once a wave's worth is free,
    and the running sequences move down meanwhile, so a wave lands in adjacent slots. Run
    here with waves as wide as the slots: each wave of 4 prompts starts only once the last
    one has ended, so the call takes at least each wave's longest output in steps; without
    waves it refills at once and takes fewer, and so does a freed slot held at most one call.
    Every output is its solo output either way (on
    a GPU up to rounding: conftest.py), and the cache ends clean."""
    from fastpar import _testing

    ctx = fastpar.Context(model, n_parallel=4, n_ctx_per_seq=256)
    prompts = MORE_PROMPTS[:12]
    budgets = [2, 14, 3, 6, 12, 2, 5, 2, 3, 9, 2, 4]
    params = greedy_params(budgets)
    calls = {}
    for wave, hold in ((0, None), (4, None), (4, 1)):
        policy = _testing.resolve_step_policy(output_on_gpu=True, kv_unified=False, memory_copies_by_position=True,
                                              share_prefixes=True, n_parallel=4, n_threads=ctx.n_threads)
        assert policy.refill_wave == 1  # an eighth of 4 slots
        assert policy.max_wave_hold == _testing.UNLIMITED_WAVE_HOLD  # a batch call waits for whole waves
        policy.refill_wave = wave
        policy.longest_first = False  # the waves are the prompts in the given order
        if hold is not None:
            policy.max_wave_hold = hold
        results = _testing.generate_with_policy(ctx._ctx, prompts, params, policy)
        for r, prompt, m in zip(results, prompts, budgets):
            assert r.finish_reason == "length", r.error  # each runs to its budget: the waves are as planned
            assert_same_greedy(r, solo(prompt, m), f"{prompt!r}, refill_wave={wave}, max_wave_hold={hold}")
        assert_clean(ctx)
        calls[wave, hold] = ctx.last_stats.n_decode_calls
    # Waves of prompts 0-3, 4-7 and 8-11: at least 14 + 12 + 9 generation steps.
    assert calls[4, None] >= 14 + 12 + 9, calls
    assert calls[0, None] < calls[4, None], calls
    # A freed slot held at most one call (the Engine's bound, StepPolicy::max_wave_hold): in between.
    assert calls[0, None] <= calls[4, 1] < calls[4, None], calls


def test_prompt_chunks_padded_to_one_length(model, solo):
    """Under a GPU's rules prompts of different lengths in adjacent slots are padded to one
    length with throw-away tokens after their chunks (StepPolicy::equal_chunks), so that
    llama.cpp passes over them once. A throw-away token lies after its slot's real tokens,
    which never attend to it, and is removed right after the call: every output is its solo
    output with the rule on and off (on a GPU up to rounding: conftest.py), the padding is
    counted, and the cache ends clean, a prefix-cached context's included."""
    from fastpar import _testing

    prompts = [f"{p} {p}" for p in PROMPTS]  # 8 prompts of 6-20 tokens
    assert len({len(model.tokenize(p)) for p in prompts}) > 4
    budgets = [6, 3, 8, 4, 5, 7, 2, 6]
    params = greedy_params(budgets)
    padding, calls = {}, {}
    for cache_mib in (0, -1):
        ctx = fastpar.Context(model, n_parallel=8, n_ctx_per_seq=256, prefix_cache_mib=cache_mib)
        for on in (True, False):
            policy = _testing.resolve_step_policy(output_on_gpu=True, kv_unified=False, memory_copies_by_position=True,
                                                  share_prefixes=True, n_parallel=8, n_threads=ctx.n_threads)
            assert policy.equal_chunks
            policy.equal_chunks = on
            results = _testing.generate_with_policy(ctx._ctx, prompts, params, policy)
            for r, prompt, m in zip(results, prompts, budgets):
                assert r.finish_reason == "length", r.error
                assert_same_greedy(r, solo(prompt, m), f"{prompt!r}, equal_chunks={on}, prefix cache {cache_mib}")
            assert_clean(ctx)
            padding[cache_mib, on] = ctx.last_stats.n_padding_tokens
            calls[cache_mib, on] = ctx.last_stats.n_decode_calls
            ctx.clear_prefix_cache()
    # The 8 prompts take one step: every chunk is padded to the longest.
    n_tokens = [len(model.tokenize(p)) for p in prompts]
    chunk_padding = sum(max(n_tokens) - n for n in n_tokens)
    assert padding[0, True] >= chunk_padding and padding[-1, True] >= chunk_padding, padding
    assert padding[0, False] < padding[0, True], padding
    # With room in the batch, padding adds no call: a throw-away token left behind would make
    # the slot's next call fail (its positions no longer consecutive) and be retried.
    assert calls[0, True] == calls[0, False] and calls[-1, True] == calls[-1, False], calls


def test_isolation_with_unified_kv(model, solo):
    ctx = fastpar.Context(model, n_parallel=8, n_ctx_per_seq=512, kv_unified=True)
    results = fastpar.generate_parallel(ctx, PROMPTS, max_tokens=48, **GREEDY)
    assert_as_solo(results, PROMPTS, solo)
    assert_clean(ctx)


def test_unified_kv_under_a_mixed_load(model):
    """One KV buffer for all slots, outputs of different lengths and refills: the load that
    once aborted the process on a GPU (256 slots there; fewer on the CPU, where it is slow).
    Every prompt runs to its own budget and the cache ends clean."""
    n_slots = 256 if ON_GPU else 12
    prompts = [f"{MORE_PROMPTS[i % len(MORE_PROMPTS)]} ({i})" for i in range(3 * n_slots)]
    budgets = [4 + (7 * i) % 29 for i in range(len(prompts))]
    ctx = fastpar.Context(model, n_parallel=n_slots, n_ctx_per_seq=128, kv_unified=True)
    params = [fastpar.SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True) for m in budgets]
    results = fastpar.generate_parallel(ctx, prompts, params)
    assert [c.error for c in results if c.error] == []
    assert [c.n_gen_tokens for c in results] == budgets
    assert ctx.last_stats.n_prompts == len(prompts)
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
    # The whole prompt in one call, then one per token; under the GPU policy the two prompts'
    # last tokens (rows with logits of different counts) go in a step of their own first
    # (StepPolicy::last_prompt_token_alone).
    assert big.last_stats.n_decode_calls == 16 + (1 if ON_GPU else 0)
    assert [c.n_prompt_tokens for c in chunked] == [len(model.tokenize(p)) for p in prompts]
    for a, b in zip(chunked, whole):
        assert_same_greedy(a, b, "a prompt fed in chunks and whole")
    assert_clean(small)


def test_batch_mates_do_not_change_a_sequence(model):
    """No cross-talk: with the same batch shapes, other prompts leave a sequence's output and
    log-probabilities bit-identical (on every backend; tests/conftest.py says why shapes matter)."""

    def exact(text: str, n: int) -> str:
        while len(model.tokenize(text)) < n:
            text += " the"
        assert len(model.tokenize(text)) == n, text
        return text

    first = ["Dogs are", "My favourite song is", "Rivers flow to"]
    second = ["Bread is made from", "The moon is", "Teachers help"]
    mates_a = [exact(p, 12) for p in first]
    mates_b = [exact(p, 12) for p in second]
    ctx = fastpar.Context(model, n_parallel=4, n_ctx_per_seq=128)
    opts = dict(max_tokens=24, ignore_eos=True, temperature=0.0, logprobs=True)
    a = fastpar.generate_parallel(ctx, [PROMPTS[0]] + mates_a, **opts)
    b = fastpar.generate_parallel(ctx, [PROMPTS[0]] + mates_b, **opts)
    assert [c.token_ids for c in a[1:]] != [c.token_ids for c in b[1:]]  # the mates really differ
    assert a[0].token_ids == b[0].token_ids
    assert a[0].logprobs == b[0].logprobs
    assert_clean(ctx)


@pytest.mark.skipif(ON_GPU, reason="on a GPU every test runs under these rules already")
def test_gpu_step_rules_change_no_output(model, solo):
    # A GPU's step rules (padding gaps between decoding slots, prompts first, a prompt's
    # last token left for a later step where rows with logits differ in token count) cut
    # steps differently, never change a token: on the CPU, where a row's logits do not
    # depend on the batch, every prompt of a refilling call under them equals its solo run.
    # Different max_tokens make slots refill at different steps, so prompts and generation mix.
    from fastpar import _core, _testing

    ctx = fastpar.Context(model, n_parallel=4, n_ctx_per_seq=512)
    policy = _testing.resolve_step_policy(output_on_gpu=True, kv_unified=False, memory_copies_by_position=True,
                                          share_prefixes=True, n_parallel=4, n_threads=ctx.n_threads)
    assert policy.last_prompt_token_alone and policy.prompts_first and policy.max_padded_gap > 0
    params = []
    for i in range(len(MORE_PROMPTS)):
        p = _core.GenerateParams()
        p.max_tokens, p.temperature = 8 + 5 * (i % 6), 0.0
        params.append(p)
    decodes = {}
    for alone in (False, True):
        policy.last_prompt_token_alone = alone
        results = _testing.generate_with_policy(ctx._ctx, MORE_PROMPTS, params, policy)
        for c, prompt, p in zip(results, MORE_PROMPTS, params):
            assert c.finish_reason in ("stop", "length"), c.error
            assert c.token_ids == solo(prompt, 48).token_ids[: p.max_tokens], prompt
        assert ctx.last_stats.n_prompts == len(MORE_PROMPTS)
        decodes[alone] = ctx.last_stats.n_decode_calls
        assert_clean(ctx)
    # The last-token rule did cut steps differently (prompts' last tokens in later steps).
    assert decodes[True] > decodes[False], decodes


def test_prompts_cut_into_chunks_go_oldest_first(model):
    """Prompt chunks go oldest first (docs/internals.md, "A step"): four prompts of about 200
    tokens on 64-token steps end one after another, the first after about 4 steps and the
    last after about 13. When prompts took turns, all four ended in the same step. The times
    only order the events; a warm-up call keeps the context's first decode out of them."""
    ctx = fastpar.Context(model, n_parallel=4, n_ctx_per_seq=512, n_batch=64)
    fastpar.generate_parallel(ctx, ["Warm up."], max_tokens=2, **GREEDY)
    prompts = [f"Chapter {i}. " + "The history of the river valley and its towns, told year by year. " * 14
               for i in range(4)]
    assert all(150 <= len(model.tokenize(p)) <= 250 for p in prompts)
    results = fastpar.generate_parallel(ctx, prompts, max_tokens=4, ignore_eos=True, **GREEDY)
    firsts = [c.t_first_token_ms for c in results]
    assert firsts == sorted(firsts), firsts
    assert firsts[0] < 0.6 * firsts[3], firsts
    assert_clean(ctx)
