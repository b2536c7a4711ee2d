"""SamplingParams: options per prompt, n samples of one prompt, top log-probabilities."""

from __future__ import annotations

import collections
import dataclasses
import json
import math

import pytest

import fastpar
from conftest import ON_GPU, PROMPTS, assert_clean

SP = fastpar.SamplingParams

# Six prompts with six different options: greedy, seeded temperatures, stops, max_tokens.
MIXED = [
    SP(temperature=0.0, max_tokens=12),
    SP(temperature=0.8, seed=11, max_tokens=10),
    SP(temperature=1.2, top_k=0, top_p=0.9, seed=12, max_tokens=14),
    SP(temperature=0.0, max_tokens=24, stop=[".", "\n"]),
    SP(temperature=0.7, min_p=0.1, seed=13, max_tokens=8, stop="the"),
    SP(temperature=0.0, max_tokens=3),
]
SAMPLE_PROMPT = "Write one sentence about the weather:"


def solo_run(model, prompt, params):
    ctx = fastpar.Context(model, n_parallel=1, n_ctx_per_seq=256)
    (c,) = fastpar.generate_parallel(ctx, [prompt], params)
    return c


@pytest.mark.skipif(ON_GPU, reason="token-exact comparison across batch shapes holds on the CPU")
def test_six_prompts_with_six_params_equal_each_alone(model):
    ctx = fastpar.Context(model, n_parallel=4, n_ctx_per_seq=256)
    got = fastpar.generate_parallel(ctx, PROMPTS[:6], MIXED)
    assert len(got) == 6 and all(isinstance(c, fastpar.Completion) for c in got)
    for i, (c, p) in enumerate(zip(got, MIXED)):
        want = solo_run(model, PROMPTS[i], p)
        assert c.token_ids == want.token_ids, i
        assert c.text == want.text, i
        assert c.n_gen_tokens <= p.max_tokens
    assert got[5].n_gen_tokens == 3 and got[5].finish_reason == "length"
    assert "." not in got[3].text and "\n" not in got[3].text
    assert_clean(ctx)


def test_one_params_for_all_is_the_keyword_shorthand(model):
    ctx = fastpar.Context(model, n_parallel=4, n_ctx_per_seq=256)
    a = fastpar.generate_parallel(ctx, PROMPTS[:4], SP(temperature=0.9, seed=5, max_tokens=8))
    b = fastpar.generate_parallel(ctx, PROMPTS[:4], temperature=0.9, seed=5, max_tokens=8)
    assert [c.token_ids for c in a] == [c.token_ids for c in b]


def test_n_samples_decode_the_prompt_once(model):
    n_tok = len(model.tokenize(SAMPLE_PROMPT))
    ctx = fastpar.Context(model, n_parallel=4, n_ctx_per_seq=256, share_prefixes=False)
    params = SP(n=4, temperature=1.0, seed=100, max_tokens=16, ignore_eos=True)
    (samples,) = fastpar.generate_parallel(ctx, [SAMPLE_PROMPT], params)
    assert len(samples) == 4
    assert len({tuple(c.token_ids) for c in samples}) == 4  # distinct
    stats = ctx.last_stats
    # Sample 0 decodes the prompt, the others only their last prompt token each; even
    # with share_prefixes=False and a prompt under the 16-token sharing minimum.
    assert n_tok < 16  # under the sharing minimum (kMinSharedPrefix)
    assert stats.n_prompt_tokens == n_tok + 3
    assert stats.n_prompt_tokens_shared == 3 * (n_tok - 1)
    assert [c.n_prompt_tokens for c in samples] == [n_tok, 1, 1, 1]
    assert stats.n_gen_tokens == 4 * 16
    again = fastpar.generate_parallel(ctx, [SAMPLE_PROMPT], params)[0]
    assert [c.token_ids for c in again] == [c.token_ids for c in samples]  # reproducible
    assert_clean(ctx)


@pytest.mark.skipif(ON_GPU, reason="token-exact comparison across batch shapes holds on the CPU")
def test_sample_j_is_a_solo_run_with_seed_plus_j(model):
    ctx = fastpar.Context(model, n_parallel=3, n_ctx_per_seq=256)
    params = SP(n=3, temperature=0.9, seed=1000, max_tokens=12)
    (samples,) = fastpar.generate_parallel(ctx, [SAMPLE_PROMPT], params)
    for j, c in enumerate(samples):
        want = solo_run(model, SAMPLE_PROMPT, dataclasses.replace(params, n=1, seed=params.seed + j))
        assert c.token_ids == want.token_ids, j


def test_n_larger_than_slots_and_mixed_shapes(model):
    ctx = fastpar.Context(model, n_parallel=2, n_ctx_per_seq=256)
    seen = {}
    got = fastpar.generate_parallel(
        ctx, [PROMPTS[0], SAMPLE_PROMPT, "word " * 300],
        [SP(temperature=0.0, max_tokens=4), SP(n=5, temperature=1.0, seed=3, max_tokens=6), SP(n=2, max_tokens=4)],
        on_completion=lambda i, r: seen.setdefault(i, r))
    assert [len(r) for r in got] == [1, 5, 2]  # any n > 1: a list of samples per prompt
    assert all(c.n_gen_tokens == 6 for c in got[1])
    assert len({tuple(c.token_ids) for c in got[1]}) > 1
    assert [c.finish_reason for c in got[2]] == ["error", "error"]  # too long: both samples fail alone
    assert sorted(seen) == [0, 1, 2] and [len(r) for r in (seen[0], seen[1], seen[2])] == [1, 5, 2]
    assert [c.token_ids for c in seen[1]] == [c.token_ids for c in got[1]]
    assert ctx.last_stats.n_prompts == 3
    assert_clean(ctx)


def test_progress_bar_with_samples(model):
    ctx = fastpar.Context(model, n_parallel=2, n_ctx_per_seq=128)
    got = fastpar.generate_parallel(ctx, PROMPTS[:2], SP(n=2, max_tokens=2, seed=1), progress=True)
    assert [len(r) for r in got] == [2, 2]


def test_top_logprobs(model):
    ctx = fastpar.Context(model, n_parallel=4, n_ctx_per_seq=256)
    k = 5
    got = fastpar.generate_parallel(ctx, PROMPTS[:4], SP(temperature=0.0, max_tokens=10, logprobs=True, top_logprobs=k))
    for c in got:
        assert len(c.top_logprobs) == c.n_gen_tokens == len(c.logprobs)
        for pos, (token, lp) in enumerate(zip(c.token_ids, c.logprobs)):
            entries = c.top_logprobs[pos]
            assert len(entries) == k
            values = [e[2] for e in entries]
            assert values == sorted(values, reverse=True)
            assert all(v <= 0 for v in values) and sum(math.exp(v) for v in values) <= 1 + 1e-4
            assert entries[0][0] == token  # greedy: the chosen token is the most likely
            assert math.isclose(entries[0][2], lp, abs_tol=1e-5)  # the same value as logprobs
            assert all(isinstance(e[1], str) for e in entries)
        json.dumps(c.to_dict())  # JSON-ready
        assert "".join(e[0][1] for e in c.top_logprobs) == c.text  # the chosen tokens' text


def test_top_logprobs_sampled_and_off(model):
    ctx = fastpar.Context(model, n_parallel=2, n_ctx_per_seq=256)
    a, b = fastpar.generate_parallel(ctx, PROMPTS[:2], [SP(temperature=1.0, seed=4, max_tokens=8, top_logprobs=20,
                                                           logprobs=True), SP(max_tokens=4)])
    assert all(len(e) == 20 for e in a.top_logprobs)
    for token, lp, entries in zip(a.token_ids, a.logprobs, a.top_logprobs):
        by_id = {e[0]: e[2] for e in entries}
        if token in by_id:
            assert math.isclose(by_id[token], lp, abs_tol=1e-5)
    assert b.top_logprobs == []


def test_errors(model):
    ctx = fastpar.Context(model, n_parallel=2, n_ctx_per_seq=128)
    with pytest.raises(ValueError, match="3 SamplingParams for 2 prompts"):
        fastpar.generate_parallel(ctx, PROMPTS[:2], [SP()] * 3)
    with pytest.raises(TypeError, match="not both"):
        fastpar.generate_parallel(ctx, PROMPTS[:2], SP(), max_tokens=3)
    with pytest.raises(TypeError, match="did you mean 'max_tokens'"):
        fastpar.generate_parallel(ctx, PROMPTS[:2], max_new_tokens=3)
    with pytest.raises(TypeError, match="params"):
        fastpar.generate_parallel(ctx, PROMPTS[:2], {"max_tokens": 3})
    with pytest.raises(TypeError, match=r"params\[1\]"):
        fastpar.generate_parallel(ctx, PROMPTS[:2], [SP(), dict(max_tokens=3)])
    with pytest.raises(ValueError, match="top_logprobs"):
        SP(top_logprobs=21)
    with pytest.raises(ValueError, match="top_logprobs"):
        fastpar.generate_parallel(ctx, PROMPTS[:2], top_logprobs=-1)
    with pytest.raises(ValueError, match="n "):
        SP(n=0)
    with pytest.raises(TypeError, match="n must be an int"):
        SP(n=2.0)
    with pytest.raises(ValueError, match="both"):
        SP(json_schema={"type": "string"}, grammar='root ::= "a"')
    with pytest.raises(ValueError, match="not valid JSON"):
        SP(json_schema="{nope")
    with pytest.raises(TypeError, match="json_schema"):
        SP(json_schema=3)
    with pytest.raises(ValueError, match="seed"):
        SP(seed=-1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        SP().max_tokens = 3
    assert_clean(ctx)


def test_logit_bias_bans_and_forces_tokens(model):
    """logit_bias: -inf or -100 bans a token over 1,000 sampled tokens, +100 forces it (sampled
    and greedy), a bias of 0 changes nothing, and an id outside the vocabulary fails its
    prompt alone."""
    ctx = fastpar.Context(model, n_parallel=8, n_ctx_per_seq=256)
    prompts = [f"Write a short sentence about the number {i}." for i in range(8)]
    sampled = dict(max_tokens=125, temperature=1.0, seed=3, ignore_eos=True, progress=False)
    base = fastpar.generate_parallel(ctx, prompts, **sampled)
    counts = collections.Counter(t for c in base for t in c.token_ids)
    common = [t for t, _ in counts.most_common(3)]
    assert counts[common[2]] >= 20  # each banned token would have come up often
    ban = {common[0]: -math.inf, common[1]: -math.inf, str(common[2]): -100}  # str: as OpenAI's JSON keys
    out = fastpar.generate_parallel(ctx, prompts, logit_bias=ban, **sampled)
    assert sum(len(c.token_ids) for c in out) == 1000
    assert not any(t in common for c in out for t in c.token_ids)
    for temperature in (1.0, 0.0):
        forced = fastpar.generate_parallel(ctx, prompts, max_tokens=16, temperature=temperature, seed=4,
                                           logit_bias={common[0]: 100}, progress=False)
        assert all(c.token_ids == [common[0]] * 16 for c in forced), temperature
    greedy = dict(max_tokens=16, temperature=0.0, progress=False)
    # A bias of 0 takes the whole-row path (no argmax shortcut): the same greedy tokens.
    assert ([c.token_ids for c in fastpar.generate_parallel(ctx, prompts, logit_bias={common[0]: 0.0}, **greedy)] ==
            [c.token_ids for c in fastpar.generate_parallel(ctx, prompts, **greedy)])
    params = [SP(max_tokens=4, temperature=0.0), SP(max_tokens=4, logit_bias={model.n_vocab: 1.0})]
    ok, bad = fastpar.generate_parallel(ctx, prompts[:2], params, progress=False)
    assert ok.finish_reason == "length" and bad.finish_reason == "error"
    assert bad.error == f"logit_bias names token {model.n_vocab}, not a token id of this model (0 to {model.n_vocab - 1})"
    for value, error in (({1: math.nan}, ValueError), ({1: math.inf}, ValueError), ({"x": 1.0}, TypeError),
                         ({1: True}, TypeError), ([1, 2], TypeError), ({-1: 1.0}, ValueError)):
        with pytest.raises(error, match="logit_bias"):
            SP(logit_bias=value)
    assert SP(logit_bias={"5": -1, 3: 2}).logit_bias == ((3, 2.0), (5, -1.0))
    assert SP(logit_bias={3: 2})._params.logit_bias == [(3, 2.0)]
    assert_clean(ctx)


def test_allowed_token_ids_keep_every_token_among_them(model):
    """allowed_token_ids: 1,000 sampled tokens all among them; a greedy answer whose tokens
    are all allowed comes out unchanged; without an end-of-generation token among them the
    output runs to max_tokens; an id outside the vocabulary fails its prompt alone."""
    ctx = fastpar.Context(model, n_parallel=8, n_ctx_per_seq=256)
    prompts = [f"Write a short sentence about the number {i}." for i in range(8)]
    allowed = [model.tokenize(w, add_special=False)[0] for w in (" the", " a", " one", " and", ".")]
    out = fastpar.generate_parallel(ctx, prompts, max_tokens=125, temperature=1.0, seed=3, allowed_token_ids=allowed,
                                    progress=False)
    assert sum(len(c.token_ids) for c in out) == 1000 and all(c.finish_reason == "length" for c in out)
    assert {t for c in out for t in c.token_ids} <= set(allowed)
    assert len({t for c in out for t in c.token_ids}) >= 2  # sampled among them, not one forced
    greedy = dict(max_tokens=24, temperature=0.0, progress=False)
    for prompt in prompts:  # each alone both times: a GPU rounds other batch shapes apart
        (plain,) = fastpar.generate_parallel(ctx, [prompt], **greedy)
        # Its own tokens and the end-of-generation token allowed: the same answer.
        (same,) = fastpar.generate_parallel(ctx, [prompt], allowed_token_ids=plain.token_ids + [model.token_eos],
                                            **greedy)
        assert same.token_ids == plain.token_ids and same.finish_reason == plain.finish_reason
    forced = fastpar.generate_parallel(ctx, prompts[:2], max_tokens=6, temperature=1.0, seed=1,
                                       allowed_token_ids=allowed, logit_bias={allowed[1]: 100}, progress=False)
    assert all(c.token_ids == [allowed[1]] * 6 for c in forced)
    params = [SP(max_tokens=4, temperature=0.0), SP(max_tokens=4, allowed_token_ids=[1, model.n_vocab])]
    ok, bad = fastpar.generate_parallel(ctx, prompts[:2], params, progress=False)
    assert ok.finish_reason == "length" and bad.finish_reason == "error"
    assert bad.error == (f"allowed_token_ids holds {model.n_vocab}, not a token id of this model "
                         f"(0 to {model.n_vocab - 1})")
    for value, error in (([], ValueError), (["x"], TypeError), (5, TypeError), ([1.5], TypeError), ([-1], ValueError)):
        with pytest.raises(error, match="allowed_token_ids"):
            SP(allowed_token_ids=value)
    assert SP(allowed_token_ids=[5, 3, 5]).allowed_token_ids == (3, 5)
    assert SP(allowed_token_ids=(3,))._params.allowed_token_ids == [3]
    assert_clean(ctx)


def test_sampling_params_values():
    d = fastpar._core.GenerateParams()
    p = SP()
    assert (p.max_tokens, p.top_k, p.n, p.top_logprobs, p.seed) == (d.max_tokens, d.top_k, d.n, d.top_logprobs, None)
    assert math.isclose(p.temperature, d.temperature, rel_tol=1e-6)
    assert SP(stop=["a", "b"]).stop == ("a", "b") and hash(SP(stop=["a"])) == hash(SP(stop=("a",)))
    assert SP(json_schema={"type": "integer"}).json_schema == '{"type": "integer"}'
    assert SP(json_schema={"type": "integer"})._params.json_schema == '{"type": "integer"}'
    assert SP(grammar='root ::= "yes" | "no"')._params.grammar == 'root ::= "yes" | "no"'
    assert dataclasses.replace(SP(max_tokens=5), n=3) == SP(max_tokens=5, n=3)


def test_engine_takes_params(model):
    with fastpar.Engine(model, n_parallel=2, n_ctx_per_seq=128) as engine:
        a = engine.generate(PROMPTS[0], SP(temperature=0.0, max_tokens=5, top_logprobs=2))
        b = engine.generate(PROMPTS[0], temperature=0.0, max_tokens=5)
        assert a.token_ids == b.token_ids and len(a.top_logprobs) == a.n_gen_tokens
        with pytest.raises(TypeError, match="not both"):
            engine.submit(PROMPTS[0], SP(), max_tokens=2)
        with pytest.raises(TypeError, match="did you mean"):
            engine.submit(PROMPTS[0], max_token=2)


@pytest.mark.skipif(ON_GPU, reason="token-exact comparison across batch shapes holds on the CPU")
def test_engine_samples_equal_generate_parallels_decoded_once(model):
    n_tok = len(model.tokenize(SAMPLE_PROMPT))
    params = SP(n=4, temperature=1.0, seed=100, max_tokens=16, ignore_eos=True)
    ctx = fastpar.Context(model, n_parallel=4, n_ctx_per_seq=256, share_prefixes=False)
    (want,) = fastpar.generate_parallel(ctx, [SAMPLE_PROMPT], params)
    with fastpar.Engine(model, n_parallel=4, n_ctx_per_seq=256, share_prefixes=False) as engine:
        request = engine.submit(SAMPLE_PROMPT, params)
        assert request.n == 4
        got = request.result()
        assert isinstance(got, list) and len(got) == 4
        assert [c.token_ids for c in got] == [c.token_ids for c in want]
        assert [c.text for c in got] == [c.text for c in want]
        # One prompt decoded once: as in generate_parallel, sample 0 decodes it and the
        # others copy its KV cache (share_prefixes=False: the group alone shares it).
        assert [c.n_prompt_tokens for c in got] == [c.n_prompt_tokens for c in want]
        assert sum(c.n_prompt_tokens for c in got) == n_tok + 3
        stats = engine.stats()
        assert (stats.n_submitted, stats.n_completed) == (4, 4)
        assert stats.n_prompt_tokens == n_tok + 3 and stats.n_prompt_tokens_shared == 3 * (n_tok - 1)
        assert [c.token_ids for c in engine.generate(SAMPLE_PROMPT, params)] == [c.token_ids for c in want]
        assert [c.token_ids for c in request.completions()] == [c.token_ids for c in got]
        assert [request.sample_result(j).token_ids for j in range(4)] == [c.token_ids for c in got]
        one = engine.submit(SAMPLE_PROMPT, dataclasses.replace(params, n=1))
        assert one.n == 1 and one.result().token_ids == want[0].token_ids  # n=1: one Completion
        assert [c.token_ids for c in one.completions()] == [want[0].token_ids]


def test_top_logprobs_rows_skip_device_sampling(model):
    # top_logprobs needs the whole row: such prompts never take the device's cut-down rows,
    # greedy prompts beside them still do.
    ctx = fastpar.Context(model, n_parallel=2, n_ctx_per_seq=128, device_sampling=True)
    if not ctx.device_sampling:
        pytest.skip("device sampling is not available for this model")
    a, b = fastpar.generate_parallel(ctx, PROMPTS[:2], [SP(temperature=0.0, max_tokens=6, top_logprobs=3),
                                                        SP(temperature=0.0, max_tokens=6, ignore_eos=True)])
    assert len(a.top_logprobs) == a.n_gen_tokens and all(len(e) == 3 for e in a.top_logprobs)
    assert ctx.last_stats.n_device_sampled == b.n_gen_tokens
