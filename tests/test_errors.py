"""Error isolation: a bad prompt fails alone; a bad call raises before any work."""

from __future__ import annotations

import math

import pytest

import fastpar
from conftest import GREEDY, PROMPTS, assert_clean

TOO_LONG = "word " * 400  # about 400 tokens, over n_ctx_per_seq=256


def test_error_isolation_too_long_prompt_fails_alone(model):
    ctx = fastpar.Context(model, n_parallel=8, n_ctx_per_seq=256)
    good = PROMPTS[:7]
    reference = fastpar.generate_parallel(ctx, good, max_tokens=32, **GREEDY)
    assert_clean(ctx)
    mixed = good[:3] + [TOO_LONG] + good[3:]
    results = fastpar.generate_parallel(ctx, mixed, max_tokens=32, **GREEDY)
    bad = results[3]
    assert bad.finish_reason == "error"
    assert "n_ctx_per_seq=256" in bad.error and "tokens" in bad.error
    assert bad.text == "" and bad.token_ids == []
    others = results[:3] + results[4:]
    assert [c.token_ids for c in others] == [c.token_ids for c in reference]
    assert all(c.error is None for c in others)
    assert ctx.last_stats.n_failed == 1
    assert_clean(ctx)


def test_prompts_tokenized_together_fail_alone(model):
    # With 8 or more free slots the waiting prompts are tokenized on several threads at
    # once: an empty and a too-long prompt among them still fail alone, in their place.
    ctx = fastpar.Context(model, n_parallel=10, n_ctx_per_seq=256)
    good = PROMPTS
    reference = fastpar.generate_parallel(ctx, good, max_tokens=16, **GREEDY)
    mixed = good[:2] + [""] + good[2:6] + [TOO_LONG] + good[6:]
    results = fastpar.generate_parallel(ctx, mixed, max_tokens=16, **GREEDY)
    assert results[2].finish_reason == "error" and "empty" in results[2].error
    assert results[7].finish_reason == "error" and "n_ctx_per_seq=256" in results[7].error
    others = results[:2] + results[3:7] + results[8:]
    assert [c.token_ids for c in others] == [c.token_ids for c in reference]
    assert ctx.last_stats.n_failed == 2
    assert_clean(ctx)


def test_empty_prompt_is_a_per_prompt_error(model):
    ctx = fastpar.Context(model, n_parallel=2, n_ctx_per_seq=256)
    empty, ok = fastpar.generate_parallel(ctx, ["", "The capital of France is"], max_tokens=8, **GREEDY)
    # SmolLM2 adds no BOS token, so "" has no tokens to continue (documented in the README).
    assert empty.finish_reason == "error" and "empty" in empty.error
    assert ok.finish_reason in ("stop", "length") and ok.n_gen_tokens > 0
    assert_clean(ctx)


def test_empty_list_gives_empty_list(model):
    ctx = fastpar.Context(model, n_parallel=2, n_ctx_per_seq=256)
    assert fastpar.generate_parallel(ctx, []) == []
    assert ctx.last_stats.n_prompts == 0


@pytest.mark.parametrize("prompts", [[1, "ok"], ["ok", None], "a string, not a list", [b"bytes"],
                                     [[{"role": "user"}]], [[{"role": "user", "content": 5}]]])
def test_bad_prompt_types_raise_type_error(model, prompts):
    ctx = fastpar.Context(model, n_parallel=2, n_ctx_per_seq=256)
    with pytest.raises(TypeError):
        fastpar.generate_parallel(ctx, prompts)


@pytest.mark.parametrize("kwargs, match", [
    (dict(temperature=math.nan), "temperature"),
    (dict(temperature=-1.0), "temperature"),
    (dict(max_tokens=-1), "max_tokens"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(min_p=-0.1), "min_p"),
    (dict(top_k=-3), "top_k"),
    (dict(repeat_penalty=0.0), "repeat_penalty"),
    (dict(presence_penalty=math.inf), "presence_penalty"),
    (dict(seed=-5), "seed"),
    (dict(stop=[""]), "stop"),
])
def test_bad_generation_options_raise_value_error(model, kwargs, match):
    ctx = fastpar.Context(model, n_parallel=2, n_ctx_per_seq=256)
    with pytest.raises(ValueError, match=match):
        fastpar.generate_parallel(ctx, ["hello"], **kwargs)
    assert ctx.last_stats.n_prompts == 0  # nothing ran


@pytest.mark.parametrize("kwargs, match", [
    (dict(n_parallel=0), "n_parallel"),
    (dict(n_parallel=257), "n_parallel"),
    (dict(n_ctx_per_seq=1), "n_ctx_per_seq"),
    (dict(n_parallel=8, n_batch=4), "n_batch"),
    (dict(n_batch=0), "n_batch"),
    (dict(n_threads=0), "n_threads"),
])
def test_bad_context_options_raise_value_error(model, kwargs, match):
    with pytest.raises(ValueError, match=match):
        fastpar.Context(model, **kwargs)


def test_wrong_option_types_raise_type_error(model):
    with pytest.raises(TypeError, match="n_parallel"):
        fastpar.Context(model, n_parallel="8")
    ctx = fastpar.Context(model, n_parallel=1, n_ctx_per_seq=256)
    with pytest.raises(TypeError, match="max_tokens"):
        fastpar.generate_parallel(ctx, ["hi"], max_tokens=1.5)
    with pytest.raises(TypeError, match="ctx"):
        fastpar.generate_parallel(model, ["hi"])


def test_gpu_layers_in_cpu_build_say_so(model):
    if fastpar.backend() != "cpu":
        pytest.skip("only a CPU build refuses GPU layers")
    with pytest.raises(ValueError, match="without a GPU backend"):
        fastpar.Model(model.path, n_gpu_layers=10)


@pytest.mark.parametrize("call", ["generate_parallel", "Engine.submit", "Engine.generate"])
def test_misspelled_option_names_the_call_and_the_close_match(model, call):
    ctx = fastpar.Context(model, n_parallel=1, n_ctx_per_seq=64)
    with fastpar.Engine(model, n_parallel=1, n_ctx_per_seq=64) as engine:
        run = {"generate_parallel": lambda **kw: fastpar.generate_parallel(ctx, ["hi"], **kw),
               "Engine.submit": lambda **kw: engine.submit("hi", **kw),
               "Engine.generate": lambda **kw: engine.generate("hi", **kw)}[call]
        with pytest.raises(TypeError) as info:
            run(max_new_tokens=3)
        assert str(info.value) == (f"{call}() got an unexpected keyword argument 'max_new_tokens'; "
                                   "did you mean 'max_tokens'?")
        with pytest.raises(TypeError, match=r"'no_such_option'; the options are max_tokens, temperature"):
            run(no_such_option=1)
        assert engine.stats().n_submitted == 0
    assert ctx.last_stats.n_prompts == 0  # nothing ran


def test_options_show_in_the_signatures():
    import inspect

    for func in (fastpar.generate_parallel, fastpar.Engine.submit, fastpar.Engine.generate,
                 fastpar.Engine.agenerate, fastpar.Engine.astream):
        params = inspect.signature(func).parameters
        assert params["max_tokens"].default == 256 and params["temperature"].default == 0.8, func
        assert params["seed"].default is None and params["logprobs"].kind is inspect.Parameter.KEYWORD_ONLY
        assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()), func


@pytest.mark.parametrize("prompts, where", [
    (["fine", "bad \udc80 byte"], r"prompts\[1\]"),
    (["fine", [{"role": "user", "content": "x\ud83d"}]], r"prompts\[1\]\[0\]\['content'\]"),
])
def test_lone_surrogate_is_a_value_error_naming_the_prompt(model, prompts, where):
    ctx = fastpar.Context(model, n_parallel=2, n_ctx_per_seq=64)
    with pytest.raises(ValueError, match=where + " is not valid text: it holds a lone surrogate"):
        fastpar.generate_parallel(ctx, prompts, max_tokens=2)
    with fastpar.Engine(model, n_parallel=1, n_ctx_per_seq=64) as engine:
        with pytest.raises(ValueError, match="prompt is not valid text"):
            engine.submit("a \ud800 b")
    assert ctx.last_stats.n_prompts == 0


def test_any_sequence_of_str_is_accepted(model):
    import numpy as np  # installed with gguf, a test requirement
    ctx = fastpar.Context(model, n_parallel=2, n_ctx_per_seq=64)
    prompts = ["The capital of France is", "Water boils at"]
    want = [c.token_ids for c in fastpar.generate_parallel(ctx, prompts, max_tokens=4, **GREEDY)]
    for seq in (tuple(prompts), np.array(prompts), np.array(prompts, dtype=object)):
        got = fastpar.generate_parallel(ctx, seq, max_tokens=4, **GREEDY)
        assert [c.token_ids for c in got] == want, type(seq)
    with pytest.raises(TypeError, match="prompts must be a sequence of str"):
        fastpar.generate_parallel(ctx, np.array([prompts, prompts]))  # 2-D
    with pytest.raises(TypeError, match="prompts must be a sequence of str"):
        fastpar.generate_parallel(ctx, "one string")


@pytest.mark.parametrize("option, value, match", [
    ("max_tokens", 10**12, r"^max_tokens must be at most 2147483647, got 1000000000000$"),
    ("top_k", 2**40, r"^top_k must be at most 2147483647, got 1099511627776$"),
    ("repeat_last_n", 2**40, r"^repeat_last_n must be at most 2147483647, got 1099511627776$"),
    ("top_k", -2**40, r"^top_k must be >= 0 \(0 = off\), got -1099511627776$"),
    ("max_tokens", -2**40, r"^max_tokens must be >= 0, got -1099511627776$"),
])
def test_integers_beyond_the_cores_range_are_value_errors_naming_the_option(model, option, value, match):
    # Once pybind11's "incompatible function arguments ... GenerateParams object at 0x...".
    with pytest.raises(ValueError, match=match):
        fastpar.SamplingParams(**{option: value})
    ctx = fastpar.Context(model, n_parallel=1, n_ctx_per_seq=64)
    with pytest.raises(ValueError, match=match):
        fastpar.generate_parallel(ctx, ["hi"], **{option: value})
    with fastpar.Engine(model, n_parallel=1, n_ctx_per_seq=64) as engine:
        with pytest.raises(ValueError, match=match):
            engine.submit("hi", **{option: value})


def test_huge_context_and_model_options_are_value_errors(model):
    for option in ("n_parallel", "n_ctx_per_seq", "n_batch", "n_threads"):
        # The core's own range where it has one (n_parallel: 1 to 256), else the 32-bit one.
        with pytest.raises(ValueError, match=f"{option} .*, got {2**40}$"):
            fastpar.Context(model, **{option: 2**40})
    with pytest.raises(ValueError, match=f"^n_gpu_layers must .*, got {2**40}$"):
        fastpar.Model(model.path, n_gpu_layers=2**40)


# Result records and requests (built by fastpar, never by users) and exceptions keep Python's own errors.
_RESULTS = {"Completion", "Stats", "EngineStats", "Loglikelihood", "RollingLoglikelihood", "Perplexity", "Request",
            "ToolCall", "ChatReply",
            "EngineClosed", "FastparError", "ModelLoadError", "QueueFull"}


def _public_calls():
    import inspect

    for name in fastpar.__all__:
        obj = getattr(fastpar, name)
        if name in _RESULTS or not callable(obj):
            continue
        if inspect.isclass(obj):
            yield name, obj, obj.__init__
            for attr, member in vars(obj).items():
                if not attr.startswith("_") and inspect.isfunction(member):
                    yield f"{name}.{attr}", member, member
        else:
            yield name, obj, obj


def test_every_public_call_names_the_keyword_meant():
    # The help generate_parallel gives for a misspelled option, on every public constructor,
    # function and method: e.g. Context(n_ctx=512) -> "did you mean 'n_ctx_per_seq'?".
    import inspect

    checked = 0
    for call, target, signature_of in _public_calls():
        params = [p for p in inspect.signature(signature_of).parameters.values() if p.name != "self" and
                  p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        for p in params:
            if len(p.name) < 4:
                continue
            wrong = p.name[:-1]  # the name less its last letter
            with pytest.raises(TypeError) as info:
                target(**{wrong: 1})
            # The first parameter that begins with it (top_ -> top_k, not top_p).
            meant = next(q.name for q in params if q.name.startswith(wrong))
            assert str(info.value) == f"{call}() got an unexpected keyword argument '{wrong}'; did you mean " \
                                      f"'{meant}'?", call
            checked += 1
    assert checked > 60
    for make, meant in [(lambda: fastpar.SamplingParams(max_new_tokens=3), "max_tokens"),
                        (lambda: fastpar.Context(None, n_ctx=512), "n_ctx_per_seq"),
                        (lambda: fastpar.Model("x.gguf", n_gpu=1), "n_gpu_layers")]:
        with pytest.raises(TypeError, match=f"did you mean '{meant}'"):
            make()
