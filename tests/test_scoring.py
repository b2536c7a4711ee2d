"""Scoring: prompt log-probabilities, loglikelihood, rolling loglikelihood and perplexity,
held against llama.cpp's llama-perplexity and against fastpar's own generation."""

from __future__ import annotations

import math
import pathlib
import re
import subprocess

import pytest

import fastpar
from conftest import N_GPU_LAYERS, ON_GPU, assert_clean
from llama_tools import llama_tool

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Real prose, long enough for a few chunks: the start of the design document.
PPL_TEXT = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")[:6000]

# Multiple-choice shaped pairs: three contexts (each well over the 16 tokens prefix sharing
# needs), four continuations each.
CONTEXTS = [
    "Question: Which planet is known as the red planet, because of the iron oxide on its surface?\nAnswer:",
    "Question: What do bees collect from flowers to make honey in their hives during the summer?\nAnswer:",
    "The following is a short story about a cat who wanted to see the sea. One morning the cat",
]
CHOICES = [
    [" Mars", " Venus", " Jupiter", " Saturn"],
    [" nectar", " water", " sand", " leaves"],
    [" woke up early", " ate a fish", " flew to the moon", " read the newspaper"],
]
PAIRS = [(c, x) for c, xs in zip(CONTEXTS, CHOICES) for x in xs]
# Rows of different batch shapes round differently (docs/design.md, internals.md
# "Isolation, measured"); on the CPU the sums below agree far closer than this.
BATCH_TOL = 1.0 if ON_GPU else 2e-3
# llama-perplexity decodes 4 chunks a batch, fastpar as many as it has slots: on the CPU the
# perplexities agree to 4 significant digits; on a GPU the batch shapes round apart (0.8 %
# measured on an H200, 85.17 against 85.87), so there the check is 2 % for the whole text
# and 5 % for the running estimates (the first ones average a few dozen tokens).
PPL_REL, PPL_CHUNK_REL = (2e-2, 5e-2) if ON_GPU else (5e-4, 5e-4)


@pytest.fixture(scope="module")
def ctx(model: fastpar.Model) -> fastpar.Context:
    return fastpar.Context(model, n_parallel=8, n_ctx_per_seq=512)


def test_perplexity_equals_llama_perplexity(model: fastpar.Model, ctx: fastpar.Context, tmp_path) -> None:
    n_ctx = 128
    ours = fastpar.perplexity(ctx, PPL_TEXT, n_ctx=n_ctx)
    assert ours.n_chunks >= 4 and ours.n_scored == ours.n_chunks * (n_ctx - n_ctx // 2 - 1)
    text = tmp_path / "text.txt"
    text.write_text(PPL_TEXT, encoding="utf-8")
    out = subprocess.run([llama_tool("llama-perplexity"), "-m", model.path, "-f", str(text), "-c", str(n_ctx),
                          "-b", str(4 * n_ctx), "-t", str(ctx.n_threads), "-ngl", str(N_GPU_LAYERS)],
                         capture_output=True, text=True, check=True)
    log = out.stdout + out.stderr
    final = float(re.search(r"Final estimate: PPL = ([0-9.]+)", log).group(1))
    running = [float(v) for v in re.findall(r"\[\d+\]([0-9.]+),", log)]
    assert len(running) == ours.n_chunks
    # llama-perplexity prints 4 decimals; the values are tens, so 4 significant digits.
    assert ours.perplexity == pytest.approx(final, rel=PPL_REL), (ours, final)
    for a, b in zip(ours.chunks, running):
        assert a == pytest.approx(b, rel=PPL_CHUNK_REL)
    assert math.isclose(math.exp(ours.nll / ours.n_scored), ours.perplexity)


def test_perplexity_of_texts_fails_alone(ctx: fastpar.Context) -> None:
    one = fastpar.perplexity(ctx, PPL_TEXT, n_ctx=64)
    both = fastpar.perplexity(ctx, ["too short", PPL_TEXT], n_ctx=64)
    assert "needs at least 128" in both[0].error and math.isnan(both[0].perplexity)
    assert both[1].error is None
    assert both[1].perplexity == pytest.approx(one.perplexity, rel=1e-4)
    with pytest.raises(ValueError, match="needs at least"):
        fastpar.perplexity(ctx, "too short", n_ctx=64)
    with pytest.raises(ValueError, match="n_ctx_per_seq"):
        fastpar.perplexity(ctx, PPL_TEXT, n_ctx=2048)


def test_greedy_continuation_loglikelihood_equals_generation_logprobs(model: fastpar.Model,
                                                                       ctx: fastpar.Context) -> None:
    prompts = ["The capital of France is", "Once upon a time, in a small village,"]
    gen = fastpar.generate_parallel(ctx, prompts, max_tokens=8, temperature=0.0, logprobs=True, ignore_eos=True)
    pairs = [(model.tokenize(p), c.token_ids) for p, c in zip(prompts, gen)]
    scores = fastpar.loglikelihood(ctx, pairs)
    for s, c in zip(scores, gen):
        assert s.error is None
        if ON_GPU:
            # Scored in another batch shape than generated: a near tie may flip (conftest.GREEDY).
            assert s.logprob == pytest.approx(math.fsum(c.logprobs), abs=BATCH_TOL)
            continue
        assert s.is_greedy
        assert s.logprob == pytest.approx(math.fsum(c.logprobs), abs=1e-4)
    # A continuation that is not the greedy one is not.
    other = fastpar.loglikelihood(ctx, [(pairs[0][0], pairs[0][1][:1] + pairs[1][1][:3])])[0]
    assert not other.is_greedy and other.logprob < scores[0].logprob


def test_batched_scoring_equals_each_pair_alone(model: fastpar.Model, ctx: fastpar.Context) -> None:
    batched = fastpar.loglikelihood(ctx, PAIRS)
    stats = ctx.last_stats
    # Each context is decoded once and copied to its other continuations.
    assert stats.n_prompt_tokens_shared > 0
    alone_ctx = fastpar.Context(model, n_parallel=1, n_ctx_per_seq=512)
    for pair, b in zip(PAIRS, batched):
        (a,) = fastpar.loglikelihood(alone_ctx, [pair])
        assert b.error is None and a.error is None
        assert b.logprob == pytest.approx(a.logprob, abs=BATCH_TOL), pair
        if not ON_GPU:
            assert b.is_greedy == a.is_greedy
    # Sharing off changes nothing either.
    unshared = fastpar.loglikelihood(fastpar.Context(model, n_parallel=8, n_ctx_per_seq=512, share_prefixes=False),
                                     PAIRS)
    for a, b in zip(unshared, batched):
        assert b.logprob == pytest.approx(a.logprob, abs=BATCH_TOL)
    assert_clean(ctx)


def test_lm_eval_tokenization_of_pairs(model: fastpar.Model, ctx: fastpar.Context) -> None:
    from fastpar._scoring import encode_pair

    # Trailing whitespace of the context moves to the continuation.
    c1, x1 = encode_pair(ctx, "The sky is ", "blue")
    c2, x2 = encode_pair(ctx, "The sky is", " blue")
    assert (c1, x1) == (c2, x2)
    assert c1 + x1 == model.tokenize("The sky is blue")
    # An empty context is the prefix token.
    c, x = encode_pair(ctx, "", "Hello world")
    assert c == [fastpar._scoring.prefix_token(ctx)] and x == model._model.tokenize("Hello world", True, False)
    (s,) = fastpar.loglikelihood(ctx, [("The sky is ", "blue")])
    (t,) = fastpar.loglikelihood(ctx, [(c2, x2)])
    assert s == t


def test_a_failing_pair_fails_alone(model: fastpar.Model, ctx: fastpar.Context) -> None:
    good = fastpar.loglikelihood(ctx, PAIRS[:4])
    ids = model.tokenize(CONTEXTS[0])
    mixed = fastpar.loglikelihood(ctx, [PAIRS[0], (ids, [model.n_vocab + 5]), PAIRS[1], (ids, list(range(600))),
                                        PAIRS[2], (ids, []), PAIRS[3]])
    assert "not a token id" in mixed[1].error and math.isnan(mixed[1].logprob)
    assert "scores at most 512" in mixed[3].error
    assert "no tokens" in mixed[5].error
    for a, b in zip(good, [mixed[0], mixed[2], mixed[4], mixed[6]]):
        assert b.error is None and b.logprob == pytest.approx(a.logprob, abs=BATCH_TOL)
    with pytest.raises(TypeError):
        fastpar.loglikelihood(ctx, ["not a pair"])
    assert_clean(ctx)


def test_prompt_logprobs_in_generation(model: fastpar.Model, ctx: fastpar.Context) -> None:
    prompt = CONTEXTS[0]
    plain = fastpar.generate_parallel(ctx, [prompt], max_tokens=6, temperature=0.0)[0]
    c = fastpar.generate_parallel(ctx, [prompt], max_tokens=6, temperature=0.0, prompt_logprobs=True)[0]
    assert c.token_ids == plain.token_ids  # scoring the prompt changes nothing generated
    ids = model.tokenize(prompt)
    assert c.prompt_token_ids == ids
    assert c.prompt_logprobs[0] is None and len(c.prompt_logprobs) == len(ids)
    assert all(v is not None and v <= 0 for v in c.prompt_logprobs[1:])
    # The same numbers as scoring the prompt's tail as a continuation.
    (s,) = fastpar.loglikelihood(ctx, [(ids[:5], ids[5:])])
    assert s.logprob == pytest.approx(math.fsum(c.prompt_logprobs[5:]), abs=BATCH_TOL)
    assert s.is_greedy == all(c.prompt_greedy[5:])
    assert plain.prompt_logprobs == [] and plain.prompt_token_ids == []
    assert plain.prompt_top_logprobs == [] and c.prompt_top_logprobs == []  # only with top_logprobs


def test_prompt_top_logprobs(model: fastpar.Model, ctx: fastpar.Context) -> None:
    """With top_logprobs=k each scored prompt position lists its k most likely tokens:
    sorted, with the log-probabilities prompt_logprobs and the generated top_logprobs use."""
    prompt = CONTEXTS[1]
    c = fastpar.generate_parallel(ctx, [prompt], max_tokens=3, temperature=0.0, prompt_logprobs=True,
                                  top_logprobs=4)[0]
    n = len(c.prompt_token_ids)
    assert len(c.prompt_top_logprobs) == n and c.prompt_top_logprobs[0] == []
    for k in range(1, n):
        top = c.prompt_top_logprobs[k]
        assert len(top) == 4
        values = [lp for _, _, lp in top]
        assert values == sorted(values, reverse=True) and values[0] <= 0
        assert c.prompt_greedy[k] == (top[0][0] == c.prompt_token_ids[k])
        for token, text, lp in top:
            assert text == model._model.token_bytes(token).decode("utf-8", "replace")
            if token == c.prompt_token_ids[k]:
                assert lp == pytest.approx(c.prompt_logprobs[k], abs=1e-4)
        assert c.prompt_logprobs[k] <= values[0] + 1e-4
    # The first generated token's alternatives, seen from the prompt's side: the same
    # prompt with that token appended lists them at its last position.
    longer = prompt + c.text[:len(model._model.token_bytes(c.token_ids[0]).decode("utf-8", "replace"))]
    d = fastpar.generate_parallel(ctx, [longer], max_tokens=0, prompt_logprobs=True, top_logprobs=4)[0]
    assert d.prompt_token_ids == c.prompt_token_ids + c.token_ids[:1]
    assert [t for t, _, _ in d.prompt_top_logprobs[n]] == [t for t, _, _ in c.top_logprobs[0]]


def test_rolling_windows_and_loglikelihood(model: fastpar.Model) -> None:
    from fastpar._scoring import rolling_windows

    tokens = list(range(100, 137))
    windows = rolling_windows(tokens, 7, 16)
    assert [t for _, cont in windows for t in cont] == tokens
    assert windows[0][0] == [7] and all(len(a) + len(b) <= 17 for a, b in windows)
    try:
        from lm_eval import utils
    except ImportError:
        pass
    else:  # the same windows as lm-evaluation-harness makes
        want = [utils.make_disjoint_window(w) for w in utils.get_rolling_token_windows(tokens, 7, 16, 1)]
        assert [(list(a), list(b)) for a, b in want] == windows

    small = fastpar.Context(model, n_parallel=4, n_ctx_per_seq=16)
    text = PPL_TEXT[:400]
    (rolled,) = fastpar.loglikelihood_rolling(small, [text])
    ids = model._model.tokenize(text, True, False)
    assert rolled.error is None and rolled.n_tokens == len(ids)
    pairs = rolling_windows(ids, fastpar._scoring.prefix_token(small), 16)
    assert len(pairs) > 3
    assert float(rolled) == pytest.approx(math.fsum(s.logprob for s in fastpar.loglikelihood(small, pairs)),
                                          abs=BATCH_TOL)
    # One window: the empty-context loglikelihood of the whole text.
    big = fastpar.Context(model, n_parallel=2, n_ctx_per_seq=512)
    (whole,) = fastpar.loglikelihood_rolling(big, [text])
    (empty,) = fastpar.loglikelihood(big, [("", text)])
    assert float(whole) == pytest.approx(empty.logprob, abs=BATCH_TOL)
