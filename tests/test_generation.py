"""Generation options: stop strings, max_tokens, finish reasons, chat prompts, stats."""

from __future__ import annotations

import pytest

import fastpar
from conftest import GREEDY, PROMPTS, assert_clean, assert_same_greedy


def test_max_tokens_gives_length(model):
    ctx = fastpar.Context(model, n_parallel=4, n_ctx_per_seq=256)
    results = fastpar.generate_parallel(ctx, PROMPTS[:4], max_tokens=5, ignore_eos=True, **GREEDY)
    for c in results:
        assert c.finish_reason == "length"
        assert c.n_gen_tokens == 5 == len(c.token_ids)


def test_max_tokens_zero_decodes_nothing(model):
    ctx = fastpar.Context(model, n_parallel=2, n_ctx_per_seq=256)
    (c,) = fastpar.generate_parallel(ctx, ["hello"], max_tokens=0)
    assert (c.finish_reason, c.text, c.n_gen_tokens, c.n_prompt_tokens) == ("length", "", 0, 0)
    assert ctx.last_stats.n_decode_calls == 0


def test_context_full_gives_length(model):
    ctx = fastpar.Context(model, n_parallel=2, n_ctx_per_seq=32)
    prompt = "The capital of France is"
    (c,) = fastpar.generate_parallel(ctx, [prompt], max_tokens=1000, ignore_eos=True, **GREEDY)
    assert c.finish_reason == "length"
    assert c.n_prompt_tokens + c.n_gen_tokens == 33  # every position used, plus the last sampled token
    assert_clean(ctx)


def test_eos_gives_stop_and_is_not_in_output(model):
    ctx = fastpar.Context(model, n_parallel=1, n_ctx_per_seq=512)
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    (c,) = fastpar.generate_parallel(ctx, [chat], max_tokens=64, **GREEDY)
    assert c.finish_reason == "stop"
    assert "Paris" in c.text
    assert "<|im_end|>" not in c.text
    assert c.n_gen_tokens == len(c.token_ids) < 64


def test_stop_string_truncates_text(model):
    ctx = fastpar.Context(model, n_parallel=2, n_ctx_per_seq=256)
    prompt = "Count: 1, 2, 3, 4,"
    (full,) = fastpar.generate_parallel(ctx, [prompt], max_tokens=24, ignore_eos=True, **GREEDY)
    assert " 7" in full.text, full.text
    (cut,) = fastpar.generate_parallel(ctx, [prompt], max_tokens=24, stop=[" 7", "never"], **GREEDY)
    assert cut.finish_reason == "stop"
    assert cut.text == full.text[: full.text.index(" 7")]
    assert cut.n_gen_tokens < full.n_gen_tokens
    (one,) = fastpar.generate_parallel(ctx, [prompt], max_tokens=24, stop=" 7", **GREEDY)
    assert one.text == cut.text


def test_chat_prompts_use_the_model_template(model):
    messages = [{"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "Name a fruit that is yellow."}]
    rendered = model.apply_chat_template(messages)
    assert "<|im_start|>user\nName a fruit that is yellow.<|im_end|>" in rendered
    assert rendered.endswith("<|im_start|>assistant\n")
    ctx = fastpar.Context(model, n_parallel=2, n_ctx_per_seq=512)
    as_chat, as_text = fastpar.generate_parallel(ctx, [messages, rendered], max_tokens=32, **GREEDY)
    n = len(model.tokenize(rendered))
    assert as_chat.n_prompt_tokens == n
    # The same tokens: the second prompt takes all but its last token from the first's KV
    # cache (share_prefixes), so it runs one step later, beside other batch-mates.
    assert (as_text.n_prompt_tokens, as_text.n_prompt_tokens_shared) == (1, n - 1)
    assert_same_greedy(as_chat, as_text, "chat messages and their rendered text")
    assert as_chat.n_gen_tokens > 0 and as_chat.text.strip()


def test_stats_equal_sums_over_completions(model):
    ctx = fastpar.Context(model, n_parallel=4, n_ctx_per_seq=256)
    results = fastpar.generate_parallel(ctx, PROMPTS, max_tokens=20, **GREEDY)
    s = ctx.last_stats
    assert s.n_prompts == len(PROMPTS)
    assert s.n_prompt_tokens == sum(c.n_prompt_tokens for c in results)
    assert s.n_gen_tokens == sum(c.n_gen_tokens for c in results)
    assert s.n_prompt_tokens == sum(len(model.tokenize(p)) for p in PROMPTS)
    assert s.n_failed == 0 and s.n_kv_full_retries == 0
    assert s.n_decode_calls >= 20  # at least one call per generated position
    assert s.t_prompt_ms > 0 and s.t_gen_ms > 0 and s.t_wall_ms >= s.t_prompt_ms + s.t_gen_ms
    assert 0 < s.t_sample_ms < s.t_gen_ms  # choosing tokens is part of the generation time
    assert s.gen_tokens_per_s == pytest.approx(s.n_gen_tokens / (s.t_gen_ms / 1000))
    assert s.prompt_tokens_per_s > 0 and s.total_tokens_per_s > 0


def test_unicode_output_is_valid_text(model):
    # Multi-byte characters span several tokens: a text cut inside one would hold U+FFFD
    # there. Only a character that max_tokens cut off at the very end may show as U+FFFD.
    ctx = fastpar.Context(model, n_parallel=3, n_ctx_per_seq=256)
    prompts = ["日本の首都は", "Emoji party: 🎉🎊", "Ünïcödé façade naïve"]
    results = fastpar.generate_parallel(ctx, prompts, max_tokens=24, ignore_eos=True, **GREEDY)
    for c in results:
        assert c.n_gen_tokens == 24
        assert "\ufffd" not in c.text.rstrip("\ufffd"), c.text
    assert any(not c.text.isascii() for c in results)  # multi-byte output was made and checked
    # Streamed, each piece is whole characters too: the pieces add up to the same text.
    with fastpar.Engine(model, n_parallel=1, n_ctx_per_seq=256) as engine:
        r = engine.submit(prompts[0], max_tokens=24, ignore_eos=True, **GREEDY)
        pieces = list(r)
    assert "".join(pieces) == r.result().text
    assert "\ufffd" not in r.result().text.rstrip("\ufffd")
    # On the CPU alone equals batched; on a GPU they may part (conftest.GREEDY).
    assert_same_greedy(r.result(), results[0], "alone in an Engine and batched")


def test_on_completion_called_once_per_prompt(model):
    ctx = fastpar.Context(model, n_parallel=3, n_ctx_per_seq=256)
    seen = []
    results = fastpar.generate_parallel(ctx, PROMPTS, max_tokens=12, on_completion=lambda i, c: seen.append((i, c)),
                                        **GREEDY)
    assert sorted(i for i, _ in seen) == list(range(len(PROMPTS)))
    for i, c in seen:
        assert c.token_ids == results[i].token_ids and c.finish_reason == results[i].finish_reason


def test_on_completion_error_cancels_the_rest_and_propagates(model):
    ctx = fastpar.Context(model, n_parallel=2, n_ctx_per_seq=256)

    def boom(i, c):
        raise RuntimeError(f"callback failed on {i}")

    with pytest.raises(RuntimeError, match="callback failed"):
        fastpar.generate_parallel(ctx, PROMPTS, max_tokens=12, on_completion=boom, **GREEDY)
    assert_clean(ctx)


def test_progress_bar_reports_prompts_and_speed(model, capsys):
    import re

    ctx = fastpar.Context(model, n_parallel=4, n_ctx_per_seq=256)
    results = fastpar.generate_parallel(ctx, PROMPTS, max_tokens=8, progress=True, **GREEDY)
    err = capsys.readouterr().err
    assert f"{len(PROMPTS)}/{len(PROMPTS)}" in err
    rates = re.findall(r"([0-9.]+) gen tok/s", err)
    assert rates, err
    # The rate the bar ends with is the one the call's statistics give.
    assert rates[-1] == f"{ctx.last_stats.gen_tokens_per_s:.1f}"
    assert len(results) == len(PROMPTS)


def test_results_print_readably_and_convert_to_json(model):
    import json

    ctx = fastpar.Context(model, n_parallel=2, n_ctx_per_seq=256)
    c, _ = fastpar.generate_parallel(ctx, PROMPTS[:2], max_tokens=4, **dict(GREEDY, logprobs=True))
    d = json.loads(json.dumps(c.to_dict()))
    assert d["text"] == c.text and d["token_ids"] == c.token_ids and d["finish_reason"] == c.finish_reason
    assert d["logprobs"] == pytest.approx(c.logprobs) and d["error"] is None
    assert d["n_gen_tokens"] == 4 and d["t_total_ms"] == pytest.approx(c.t_total_ms)
    assert repr(c).startswith("Completion(finish_reason='length', error=None, ") and repr(c.text[:60]) in repr(c)
    s = ctx.last_stats
    d = json.loads(json.dumps(s.to_dict()))
    assert d["n_prompts"] == 2 and d["n_gen_tokens"] == s.n_gen_tokens == 8 and d["backend"] == fastpar.backend()
    assert d["gen_tokens_per_s"] == pytest.approx(s.gen_tokens_per_s)
    assert repr(s).startswith("Stats(n_prompts=2, n_failed=0, ") and f"n_gen_tokens={s.n_gen_tokens}" in repr(s)
    with fastpar.Engine(model, n_parallel=1, n_ctx_per_seq=64) as engine:
        engine.generate("Hi", max_tokens=2)
        es = engine.stats()
        d = json.loads(json.dumps(es.to_dict()))
        assert d["n_submitted"] == 1 and d["n_gen_tokens"] == es.n_gen_tokens and "n_completed=1" in repr(es)
