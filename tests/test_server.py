"""`fastpar serve` through OpenAI's own client: the schemas, the errors, and behaviour under
load with clients that leave (fastpar.server; docs/server.md)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest

import fastpar
from conftest import N_GPU_LAYERS, ON_GPU, SANITIZER, SLOWDOWN, assert_same_greedy

# The test extra brings these (pyproject.toml); a missing one is an error, never a skip.
import httpx  # noqa: E402
import jsonschema  # noqa: E402
import openai  # noqa: E402
import uvicorn  # noqa: E402

from fastpar.server import create_app  # noqa: E402

CHAT = [{"role": "user", "content": "Name three primary colors."}]


@contextlib.contextmanager
def running(app):
    """The app served by uvicorn on a free port of this host, on a background thread."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


@pytest.fixture(scope="module")
def engine(model):
    with fastpar.Engine(model, n_parallel=8, n_ctx_per_seq=512) as e:
        yield e


@pytest.fixture(scope="module")
def url(engine):
    with running(create_app(engine, model_name="smol")) as u:
        yield u


@pytest.fixture(scope="module")
def client(url):
    with openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def aclient(url):
    """A new async client for each event loop (its connections belong to one)."""
    return lambda: openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def test_models_health_metrics(url, client, engine):
    assert [m.id for m in client.models.list().data] == ["smol"]
    h = httpx.get(url + "/health")
    assert h.status_code == 200
    assert h.json() == {"status": "ok", "model": "smol", "slots_busy": 0, "slots_total": 8, "queue_depth": 0}
    client.completions.create(model="smol", prompt="Water boils at", max_tokens=3, temperature=0)
    m = httpx.get(url + "/metrics").text
    assert 'fastpar_requests_total{endpoint="completions",outcome="success"}' in m
    assert "fastpar_time_to_first_token_seconds_bucket" in m and "fastpar_busy_slots 0.0" in m
    # The prefix cache's counts are the engine's own (its cache is off by default here).
    s = engine.prefix_cache_stats()
    assert f"fastpar_prefix_cache_tokens_reused_total {float(s.n_tokens_reused)}" in m
    assert "fastpar_prefix_cache_hits_total" in m and "fastpar_prefix_cache_bytes" in m
    assert "fastpar_prefix_cache_tokens_held" in m
    assert f"fastpar_prefix_cache_host_copy_seconds_total {s.t_host_ms / 1000}" in m
    assert f"fastpar_prefix_cache_not_saved_total {float(s.n_not_saved)}" in m


def test_text_events_from_a_template_are_the_events_bytes():
    # A streamed piece's event comes from a template made once per choice; it must be the
    # very bytes of encoding the whole event, whatever the text holds.
    from fastpar.server.app import _sse, _TextEvents

    def event(index, text):
        return _sse({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                     "system_fingerprint": None, "choices": [{"index": index, "delta": {"content": text},
                                                              "logprobs": None, "finish_reason": None}],
                     "usage": None})

    events = _TextEvents(event)
    for text in ["", "a", ' "quoted" \\ back', "line\nbreak\ttab", "\x00\x1f nul", "中文 🎉", "\u2028\u2029", "x" * 5000]:
        for index in (0, 3, 0):
            assert events(index, text) == event(index, text), (index, text)
    assert sorted(events.templates) == [0, 3]


def test_stream_interval_gathers_pieces_and_keeps_the_text(engine):
    # --stream-interval 4: after the first piece (sent at once), each text event carries at
    # least 4 pieces, the last one fewer; the text is the whole answer's, both choices alike.
    with pytest.raises(ValueError, match="stream_interval"):
        create_app(engine, stream_interval=0)
    body = {"model": "smol", "prompt": "The capital of France is", "max_tokens": 21, "temperature": 0,
            "n": 2, "stream": True, "ignore_eos": True}
    with running(create_app(engine, model_name="smol", stream_interval=4)) as u:
        with httpx.stream("POST", u + "/v1/completions", json=body, timeout=60) as r:
            events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
        whole = httpx.post(u + "/v1/completions", json=dict(body, stream=False, logprobs=0), timeout=60).json()
    for index in (0, 1):
        texts = [e["choices"][0]["text"] for e in events
                 if e["choices"][0]["index"] == index and e["choices"][0]["finish_reason"] is None]
        choice = whole["choices"][index]
        assert "".join(texts) == choice["text"] and len(choice["logprobs"]["tokens"]) == 21
        assert texts[0] == choice["logprobs"]["tokens"][0]
        # 21 pieces: the first alone, then events of >= 4 (at most 5 of them), the finish apart.
        assert len(texts) <= 1 + 5 + 1, texts


def test_chat_stream_equals_whole_and_usage_counts_tokens(client, model, engine):
    whole = client.chat.completions.create(model="smol", messages=CHAT, max_tokens=24, temperature=0)
    (choice,) = whole.choices
    direct = engine.generate(CHAT, max_tokens=24, temperature=0.0)
    assert choice.message.role == "assistant" and choice.message.content == direct.text
    assert choice.finish_reason == {"stop": "stop", "length": "length"}[direct.finish_reason]
    prompt_tokens = len(model.tokenize(model.apply_chat_template(CHAT)))
    assert whole.usage.prompt_tokens == prompt_tokens
    assert whole.usage.completion_tokens == len(direct.token_ids)
    assert whole.usage.total_tokens == prompt_tokens + len(direct.token_ids)

    chunks = list(client.chat.completions.create(model="smol", messages=CHAT, max_tokens=24, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == choice.message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == choice.finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.model_dump() == whole.usage.model_dump()
    assert all(c.usage is None for c in chunks[:-1])


def test_completions_prompt_list_and_stream(aclient, solo, model):
    prompts = ["The capital of France is", "Water boils at", "The three primary colors are"]
    # On a GPU the three prompts in one batch round differently from each alone
    # (conftest.GREEDY): their tokens' log-probabilities are compared instead of the texts.
    scores = {"logprobs": 0} if ON_GPU else {}

    async def go():
        client = aclient()
        whole = await client.completions.create(model="smol", prompt=prompts, max_tokens=12, temperature=0, **scores)
        stream = await client.completions.create(model="smol", prompt=prompts[0], max_tokens=12, temperature=0,
                                                  stream=True)
        pieces = [c.choices[0].text async for c in stream]
        echo = await client.completions.create(model="smol", prompt=prompts[1], max_tokens=4, temperature=0,
                                               echo=True)
        await client.close()
        return whole, "".join(pieces), echo

    whole, streamed, echo = asyncio.run(go())
    assert [c.index for c in whole.choices] == [0, 1, 2]
    for c, p in zip(whole.choices, prompts):
        if ON_GPU:
            want = solo(p, 12)
            named = [model.token_bytes(t).decode("utf-8", "replace") for t in want.token_ids]
            assert_same_greedy(SimpleNamespace(token_ids=c.logprobs.tokens, logprobs=c.logprobs.token_logprobs),
                               SimpleNamespace(token_ids=named, logprobs=want.logprobs), f"{p!r} in a list")
        else:
            assert c.text == solo(p, 12).text
    assert streamed == solo(prompts[0], 12).text  # alone, as the solo run
    counts = [len(c.logprobs.tokens) for c in whole.choices] if ON_GPU else [len(solo(p, 12).token_ids) for p in prompts]
    assert whole.usage.completion_tokens == sum(counts)
    assert echo.choices[0].text == prompts[1] + solo(prompts[1], 4).text


def test_n_and_seed_reproduce_generate_parallel(client, solo_ctx):
    kw = dict(model="smol", prompt="Once upon a time, in a small village,", max_tokens=10, temperature=0.9, seed=5)
    a = client.completions.create(n=3, **kw)
    b = client.completions.create(n=3, **kw)
    assert [c.text for c in a.choices] == [c.text for c in b.choices]
    assert [c.index for c in a.choices] == [0, 1, 2]
    # Sample j is seeded seed + j, as generate_parallel's n: the same texts.
    (want,) = fastpar.generate_parallel(solo_ctx, [kw["prompt"]], max_tokens=10, temperature=0.9, seed=5, n=3,
                                         top_p=1.0)  # OpenAI's default
    if not ON_GPU:
        assert [c.text for c in a.choices] == [c.text for c in want]
    assert len({c.text for c in a.choices}) > 1


def test_stop(client, solo):
    prompt = "The three primary colors are"
    full = solo(prompt, 24).text
    stop = full.strip().split()[1]
    r = client.completions.create(model="smol", prompt=prompt, max_tokens=24, temperature=0, stop=[stop, "zzz"])
    assert r.choices[0].finish_reason == "stop" and r.choices[0].text == full[:full.index(stop)]


def test_logprobs(client):
    r = client.chat.completions.create(model="smol", messages=CHAT, max_tokens=8, temperature=0, logprobs=True,
                                       top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == 8 or r.choices[0].finish_reason == "stop"
    assert bytes(b for t in content for b in t.bytes).decode() == r.choices[0].message.content
    for t in content:
        assert len(t.top_logprobs) == 3 and t.logprob <= 0
        assert t.top_logprobs[0].token == t.token and abs(t.top_logprobs[0].logprob - t.logprob) < 1e-4  # greedy
    c = client.completions.create(model="smol", prompt="Water boils at", max_tokens=5, temperature=0, logprobs=2)
    lp = c.choices[0].logprobs
    assert "".join(lp.tokens) == c.choices[0].text and len(lp.token_logprobs) == 5
    assert all(len(t) == 2 for t in lp.top_logprobs) and lp.text_offset[0] == 0


def test_echo_with_logprobs_scores_the_prompt(client, aclient, model):
    """echo + logprobs: the prompt's own tokens with their log-probabilities first (what
    lm-eval's API models score with), then the generated ones; the numbers are
    fastpar.loglikelihood's."""
    prompt = "The capital of France is Paris, and the capital of Italy is"
    ids = model.tokenize(prompt)
    ctx = fastpar.Context(model, n_parallel=1, n_ctx_per_seq=128)
    (want,) = fastpar.loglikelihood(ctx, [(ids[:1], ids[1:])])
    c = client.completions.create(model="smol", prompt=prompt, max_tokens=0, echo=True, logprobs=2, temperature=0)
    ch = c.choices[0]
    lp = ch.logprobs
    assert ch.text == prompt and ch.finish_reason == "length"
    assert len(lp.tokens) == len(ids) and "".join(lp.tokens) == prompt
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert sum(lp.token_logprobs[1:]) == pytest.approx(want.logprob, abs=2e-3)
    # lm-eval's greedy test: a token is greedy when its log-probability is its position's best.
    greedy = all(abs(v - max(top.values())) < 1e-6 for v, top in zip(lp.token_logprobs[1:], lp.top_logprobs[1:]))
    assert greedy == want.is_greedy
    assert all(len(top) == 2 and max(top.values()) >= v - 1e-6
               for v, top in zip(lp.token_logprobs[1:], lp.top_logprobs[1:]))
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:k]) for k in range(len(ids))]
    assert c.usage.prompt_tokens == len(ids) and c.usage.completion_tokens == 0

    # Generating as well: the prompt's part, then the new tokens; streamed, the same.
    g = client.completions.create(model="smol", prompt=prompt, max_tokens=4, echo=True, logprobs=1, temperature=0,
                                  extra_body={"ignore_eos": True})
    glp = g.choices[0].logprobs
    assert g.choices[0].text.startswith(prompt) and "".join(glp.tokens) == g.choices[0].text
    assert len(glp.tokens) == len(ids) + 4
    assert glp.token_logprobs[1:len(ids)] == pytest.approx(lp.token_logprobs[1:], abs=2e-3)
    assert glp.token_logprobs[0] is None and all(v is not None for v in glp.token_logprobs[1:])

    async def streamed():
        async with aclient() as ac:
            stream = await ac.completions.create(model="smol", prompt=prompt, max_tokens=4, echo=True, logprobs=1,
                                                 temperature=0, stream=True, extra_body={"ignore_eos": True})
            text, logprobs = "", None
            async for chunk in stream:
                for choice in chunk.choices:
                    text += choice.text
                    logprobs = choice.logprobs or logprobs
            return text, logprobs

    text, slp = asyncio.run(streamed())
    assert text == g.choices[0].text and slp.tokens == glp.tokens
    assert slp.token_logprobs[1:] == pytest.approx(glp.token_logprobs[1:], abs=1e-5)


def test_response_format(client):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 120}},
              "required": ["name", "age"], "additionalProperties": False}
    msgs = [{"role": "user", "content": "Invent a person; answer in JSON with name and age."}]
    r = client.chat.completions.create(model="smol", messages=msgs, max_tokens=64, temperature=0.8, seed=1, n=3,
                                       response_format={"type": "json_schema",
                                                        "json_schema": {"name": "person", "schema": schema}})
    for c in r.choices:
        jsonschema.validate(json.loads(c.message.content), schema)
    r = client.chat.completions.create(model="smol", messages=msgs, max_tokens=64, temperature=0,
                                       response_format={"type": "json_object"})
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_guided_choice(client):
    # vLLM's extra field: every choice is one of the labels, at any temperature.
    labels = ["red", "green", 'blue "sky"']
    r = client.chat.completions.create(model="smol", messages=CHAT, max_tokens=32, temperature=1.0, seed=2, n=6,
                                       extra_body={"guided_choice": labels})
    assert all(c.message.content in labels and c.finish_reason == "stop" for c in r.choices), r.choices
    r = client.completions.create(model="smol", prompt="My favourite colour is", max_tokens=32, temperature=0,
                                  extra_body={"guided_choice": labels})
    assert r.choices[0].text in labels
    for extra in ({"guided_choice": []}, {"guided_choice": ["a", ""]}, {"guided_choice": "red"},
                  {"guided_choice": ["a"], "response_format": {"type": "json_object"}}):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="smol", messages=CHAT, max_tokens=4, extra_body=extra)
        assert e.value.param == "guided_choice", e.value.body


def test_guided_regex(client):
    # vLLM's extra field: every output matches the regex whole, streamed or not.
    regex = r"\d{3}-\d{4}"
    r = client.chat.completions.create(model="smol", messages=CHAT, max_tokens=32, temperature=1.0, seed=2, n=4,
                                       extra_body={"guided_regex": regex})
    assert all(re.fullmatch(regex, c.message.content) and c.finish_reason == "stop" for c in r.choices), r.choices
    stream = client.completions.create(model="smol", prompt="Call me at", max_tokens=32, temperature=0, stream=True,
                                       extra_body={"guided_regex": regex})
    assert re.fullmatch(regex, "".join(chunk.choices[0].text for chunk in stream if chunk.choices))
    for extra in ({"guided_regex": ""}, {"guided_regex": 5}, {"guided_regex": "(?=a)b"}, {"guided_regex": "(ab"},
                  {"guided_regex": "a", "guided_choice": ["a"]}):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="smol", messages=CHAT, max_tokens=4, extra_body=extra)
        assert e.value.param == "guided_regex", e.value.body


def test_logit_bias(client, model):
    # OpenAI's field: +100 forces a token, false or -100 bans it; keys are token ids as strings.
    token = model.tokenize(" yes", add_special=False)[0]
    r = client.chat.completions.create(model="smol", messages=CHAT, max_tokens=4, temperature=1.0, seed=1,
                                       logit_bias={str(token): 100})
    assert r.choices[0].message.content == " yes" * 4, r.choices[0]
    # Banning the first token of the greedy answer changes it; false bans as -100 does.
    prompt = "The capital of France is"
    plain = client.completions.create(model="smol", prompt=prompt, max_tokens=8, temperature=0).choices[0].text
    first = model.tokenize(plain, add_special=False)[0]
    banned = [client.completions.create(model="smol", prompt=prompt, max_tokens=8, temperature=0,
                                        extra_body={"logit_bias": {str(first): b}}).choices[0].text for b in (-100, False)]
    assert banned[0] == banned[1] and not banned[0].startswith(model.token_bytes(first).decode()), (plain, banned)
    for bias in ({"x": 1}, {"1": 101}, {"1": "1"}, [1], {str(model.n_vocab): 1}):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="smol", messages=CHAT, max_tokens=4, extra_body={"logit_bias": bias})
        assert e.value.param == "logit_bias", e.value.body


def test_allowed_token_ids(client, model):
    # vLLM's field: every generated token is one of these.
    allowed = [model.tokenize(w, add_special=False)[0] for w in (" yes", " no")]
    r = client.completions.create(model="smol", prompt="Answer:", max_tokens=8, temperature=1.0, seed=1,
                                  extra_body={"allowed_token_ids": allowed}, logprobs=1)
    assert r.choices[0].finish_reason == "length"
    assert set(r.choices[0].logprobs.tokens) <= {" yes", " no"}, r.choices[0]
    for value in ([], [-1], ["1"], 5, [model.n_vocab]):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="smol", messages=CHAT, max_tokens=4,
                                           extra_body={"allowed_token_ids": value})
        assert e.value.param == "allowed_token_ids", e.value.body


def test_limits_are_400s_naming_the_option(model):
    from fastpar.server import create_app
    from fastpar.server.protocol import Limits

    limits = Limits(max_body_mib=1 / 1024, max_n=2, max_prompts=3, max_tokens=5)
    with fastpar.Engine(model, n_parallel=2, n_ctx_per_seq=256) as engine, \
            running(create_app(engine, limits=limits)) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        r = client.completions.create(model="m", prompt="Once upon a time", temperature=0)  # no max_tokens: the cap
        assert r.usage.completion_tokens <= 5 and r.choices[0].finish_reason in ("length", "stop")
        for kwargs, param, option in ((dict(prompt="x" * 2000), None, "--max-body-mib"),
                                      (dict(prompt="Hi", n=3), "n", "--max-n"),
                                      (dict(prompt=["a", "b", "c", "d"]), "prompt", "--max-prompts"),
                                      (dict(prompt="Hi", max_tokens=6), "max_tokens", "--max-tokens")):
            with pytest.raises(openai.BadRequestError) as e:
                client.completions.create(model="m", **kwargs)
            assert e.value.param == param and option in e.value.message, e.value.body
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="m", messages=CHAT, max_completion_tokens=9)
        assert e.value.param == "max_completion_tokens" and "--max-tokens" in e.value.message
    for bad in (dict(max_n=0), dict(max_prompts=1.5), dict(max_tokens=-1), dict(max_body_mib=0)):
        with pytest.raises(ValueError):
            Limits(**bad)


def test_priority_field(client):
    # vLLM's field, passed to the engine's queue (its order: test_engine.py).
    r = client.completions.create(model="smol", prompt="Hello", max_tokens=2, temperature=0,
                                  extra_body={"priority": -5})
    assert r.choices[0].finish_reason == "length"
    for bad in ("high", 1.5, 1 << 40):
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(model="smol", prompt="Hello", max_tokens=2, extra_body={"priority": bad})
        assert e.value.param == "priority", e.value.body


@pytest.mark.parametrize("extra, param", [
    ({"temperature": 3}, "temperature"),
    ({"max_tokens": "ten"}, "max_tokens"),
    ({"n": 0}, "n"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"messages": [{"content": "no role"}]}, "messages[0]"),
    ({"messages": [{"role": "wizard", "content": "Hi"}]}, "messages[0].role"),
    ({"response_format": {"type": "json_schema"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format"),
    ({"functions": [{"name": "f"}]}, "functions"),  # the legacy field; tools: test_tools.py
    ({"tools": [{"type": "function", "function": {}}]}, "tools"),
])
def test_bad_fields_are_400_naming_them(client, extra, param):
    body = {"model": "smol", "messages": CHAT, "max_tokens": 4, **extra}
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(**body)
    assert e.value.status_code == 400 and e.value.param == param, e.value.body
    assert set(e.value.body) == {"message", "type", "param", "code"}


def test_prompt_too_long_and_bad_json_are_400(url, client):
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(model="smol", prompt="word " * 2000, max_tokens=4, stream=stream)
        assert e.value.code == "context_length_exceeded" and "n_ctx_per_seq=512" in e.value.message
    r = httpx.post(url + "/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    # in a list, the error names the prompt
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="smol", prompt=["Hi", "word " * 2000], max_tokens=4)
    assert e.value.param == "prompt[1]" and e.value.body["message"].startswith("'prompt[1]': ")
    assert e.value.code == "context_length_exceeded"
    # none of it disturbed the server
    assert client.completions.create(model="smol", prompt="Hi", max_tokens=2).usage.completion_tokens == 2


def test_unknown_paths_get_openai_error_bodies(url, client):
    r = httpx.get(url + "/v1/nothing")
    assert r.status_code == 404
    assert r.json() == {"error": {"message": "no such endpoint: GET /v1/nothing", "type": "invalid_request_error",
                                  "param": None, "code": "not_found"}}
    r = httpx.get(url + "/v1/completions")
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"
    assert r.headers["allow"] == "POST"
    with pytest.raises(openai.NotFoundError):
        client.images.generate(model="smol", prompt="Hi")
    # A generating server knows /v1/embeddings and says how to serve it.
    with pytest.raises(openai.BadRequestError, match="--embeddings"):
        client.embeddings.create(model="smol", input="Hi")


def test_api_key_and_queue_full(model):
    with fastpar.Engine(model, n_parallel=1, n_ctx_per_seq=256, max_queued=1) as e, \
            running(create_app(e, api_key="sekrit")) as u:
        assert httpx.get(u + "/health").status_code == 200  # open without the key
        with pytest.raises(openai.AuthenticationError), openai.OpenAI(base_url=u + "/v1", api_key="wrong",
                                                                      max_retries=0) as wrong:
            wrong.models.list()
        r = httpx.post(u + "/v1/completions", json={"prompt": "Hi", "max_tokens": 1})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"

        async def one(client):
            try:
                await client.completions.create(model="m", prompt="Count: 1, 2, 3,", max_tokens=48, temperature=0,
                                                 extra_body={"ignore_eos": True})
                return 200
            except openai.RateLimitError as err:
                assert err.response.headers["retry-after"] == "1" and err.code == "queue_full"
                return 429

        async def burst():
            async with openai.AsyncOpenAI(base_url=u + "/v1", api_key="sekrit", max_retries=0) as client:
                return await asyncio.gather(*(one(client) for _ in range(5)))

        codes = asyncio.run(burst())
        assert codes.count(200) >= 2 and codes.count(429) >= 1, codes  # one slot + one queued
    # the app's own limit, below the engine's: nothing may wait
    with fastpar.Engine(model, n_parallel=1, n_ctx_per_seq=256) as e, running(create_app(e, max_queued=0)) as u:
        r = httpx.post(u + "/v1/completions", json={"prompt": ["a", "b"], "max_tokens": 1})
        assert r.status_code == 429 and r.headers["retry-after"] == "1", r.text
        assert httpx.post(u + "/v1/completions", json={"prompt": "a", "max_tokens": 1}).status_code == 200


def test_sse_error_event_when_the_engine_stops(model):
    e = fastpar.Engine(model, n_parallel=2, n_ctx_per_seq=256)
    with running(create_app(e)) as u, openai.OpenAI(base_url=u + "/v1", api_key="x", max_retries=0) as client:
        stream = client.completions.create(model="m", prompt="Count: 1, 2, 3,", max_tokens=400, temperature=0,
                                           stream=True)
        with pytest.raises(openai.APIError) as err:
            for k, _ in enumerate(stream):
                if k == 3:
                    e.close()  # the server goes away under a running stream
        assert "cancelled" in str(err.value)
        assert httpx.get(u + "/health").status_code == 503


# -- under load, in a real `fastpar serve` process --------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve_process(model, log, *options: str):
    """`fastpar serve` on the model in a process of its own, its output in `log`, ready
    (200 from /health): yields (process, base URL); killed at the end if still running."""
    port = _free_port()
    with open(log, "w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "fastpar", "serve", model.path, "--port", str(port),
                                 "--n-gpu-layers", str(N_GPU_LAYERS), *options], stdout=f, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:  # 503 while loading, then 200
            assert proc.poll() is None, log.read_text()
            try:
                if httpx.get(base + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the server did not become ready"
            time.sleep(0.1)
        yield proc, base
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def test_health_answers_while_the_engine_is_held(model):
    # /health never waits on generation: it answers while the engine's thread is held inside
    # a step (a request's update callback runs on that thread and blocks it here). Waiting
    # on the engine would leave it unanswered until the release, whatever the machine's speed.
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        held.set()
        release.wait(120)

    with fastpar.Engine(model, n_parallel=2, n_ctx_per_seq=256) as e, running(create_app(e)) as base:
        request = e.submit("Count: 1, 2,", max_tokens=40, ignore_eos=True)
        request.on_update(hold)
        try:
            assert held.wait(120), "the request produced no piece"
            answers = []
            asker = threading.Thread(target=lambda: answers.append(httpx.get(base + "/health", timeout=120)))
            asker.start()
            asker.join(120)
            assert not request.done() and not release.is_set()
            assert answers and answers[0].status_code == 200, answers
            assert answers[0].json()["slots_busy"] == 1
        finally:
            release.set()
        request.on_update(lambda: None)
        assert request.result().n_gen_tokens == 40


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the server's memory from /proc")
def test_many_streams_with_clients_leaving(model, tmp_path):
    log = tmp_path / "serve.log"
    # one core left for the HTTP side (this process's 64 clients)
    with serve_process(model, log, "--n-parallel", "16", "--n-ctx-per-seq", "256", "--n-threads", "1",
                       "--shutdown-timeout", "2", "--log-level", "warning") as (proc, base):
        prompts = ["The capital of France is", "def fibonacci(n):\n", "Once upon a time,", "Water boils at",
                   "The best way to learn a language is", "Dear Sir or Madam,"]

        async def user(client, rng: random.Random, n_requests: int, tally: dict):
            for _ in range(n_requests):
                leave_after = rng.choice([None, None, 0, 1, 3, 6])  # chunks read before leaving; None: all
                chat = rng.random() < 0.5
                kw = dict(model="m", max_tokens=rng.randint(4, 12), temperature=0.7, stream=True)
                try:
                    if chat:
                        s = await client.chat.completions.create(
                            messages=[{"role": "user", "content": rng.choice(prompts)}], **kw)
                    else:
                        s = await client.completions.create(prompt=rng.choice(prompts), **kw)
                    k = 0
                    async for _ in s:
                        k += 1
                        if leave_after is not None and k >= leave_after:
                            break
                    await s.close()
                    tally["left" if leave_after is not None and k >= leave_after else "done"] += 1
                except openai.APIError as err:  # nothing may fail
                    tally.setdefault("errors", []).append(repr(err))

        async def round_(seed: int) -> dict:
            tally = {"done": 0, "left": 0}
            rngs = [random.Random(seed * 1000 + u) for u in range(64)]
            async with openai.AsyncOpenAI(base_url=base + "/v1", api_key="x", max_retries=0,
                                          http_client=httpx.AsyncClient(limits=httpx.Limits(max_connections=100))
                                          ) as client:
                await asyncio.wait_for(asyncio.gather(*(user(client, r, 4, tally) for r in rngs)), timeout=300)
            return tally

        async def rounds():
            first = await round_(1)
            await asyncio.sleep(0.5)
            rss1 = _rss_kib(proc.pid)
            second = await round_(1)
            await asyncio.sleep(0.5)
            return first, rss1, second, _rss_kib(proc.pid)

        first, rss1, second, rss2 = asyncio.run(rounds())
        for tally in (first, second):
            assert not tally.get("errors"), tally["errors"][:3]
            assert tally["done"] + tally["left"] == 256 and tally["left"] > 50
        # every slot free again, nothing queued (the engine's own counts)
        deadline = time.monotonic() + 5
        while (h := httpx.get(base + "/health").json())["slots_busy"] or h["queue_depth"]:
            assert time.monotonic() < deadline, h
            time.sleep(0.05)
        if SANITIZER != "asan":
            assert rss2 < rss1 * 1.05, (rss1, rss2)
        m = httpx.get(base + "/metrics").text
        assert 'outcome="client_disconnect"' in m
        # `fastpar serve` keeps its prefix cache by default: the repeated chat prompts used it.
        hits = re.search(r"^fastpar_prefix_cache_hits_total (\S+)$", m, re.M)
        assert hits is not None and float(hits.group(1)) > 0, m

        # SIGTERM after that load, with a request in flight: it gets --shutdown-timeout to
        # finish, then is cancelled; the process exits 0 (what the client gets:
        # test_sigterm_answers_the_requests_in_flight).
        got = []

        def long_stream():
            body = {"prompt": "Count: 1, 2,", "max_tokens": 250, "ignore_eos": True, "stream": True}
            try:
                with httpx.stream("POST", base + "/v1/completions", json=body, timeout=60) as r:
                    for line in r.iter_lines():
                        got.append(line)
            except httpx.HTTPError:
                got.append("cut")

        t = threading.Thread(target=long_stream, daemon=True)
        t.start()
        deadline = time.monotonic() + 60
        while len(got) < 3:
            assert time.monotonic() < deadline and t.is_alive(), got
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text()
        t.join(10)
        assert not t.is_alive()


def test_sigterm_answers_the_requests_in_flight(model, tmp_path):
    """SIGTERM with a request of each kind still generating: after --shutdown-timeout they
    are cancelled and answered as docs/server.md says (503 with OpenAI's error body; a
    stream's error event), not killed mid-answer, and the process exits 0."""
    log = tmp_path / "serve.log"
    with serve_process(model, log, "--n-parallel", "2", "--n-ctx-per-seq", "2048", "--shutdown-timeout", "1",
                       "--log-level", "info") as (proc, base):
        body = {"prompt": "Count: 1, 2,", "max_tokens": 2000, "ignore_eos": True}  # far longer than the test
        got: dict = {"stream": []}

        def whole():
            got["whole"] = httpx.post(base + "/v1/completions", json=body, timeout=120)

        def stream():
            with httpx.stream("POST", base + "/v1/completions", json={**body, "stream": True}, timeout=120) as r:
                got["stream_status"] = r.status_code
                for line in r.iter_lines():
                    if line:
                        got["stream"].append(line)

        threads = [threading.Thread(target=f, daemon=True) for f in (whole, stream)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while len(got["stream"]) < 3 or httpx.get(base + "/health").json()["slots_busy"] < 2:
            assert time.monotonic() < deadline and all(t.is_alive() for t in threads), got
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text()
        for t in threads:
            t.join(30)
            assert not t.is_alive()

    r = got["whole"]
    assert r.status_code == 503 and r.headers["content-type"] == "application/json", r.text
    assert r.json() == {"error": {"message": "the request was cancelled: the server is shutting down",
                                  "type": "server_error", "param": None, "code": "cancelled"}}
    lines = got["stream"]
    assert got["stream_status"] == 200 and "data: [DONE]" not in lines
    assert lines[-1].startswith("data: ") and json.loads(lines[-1][len("data: "):])["error"]["code"] == "cancelled"
    assert all("error" not in json.loads(x[len("data: "):]) for x in lines[:-1])
    text = log.read_text()
    assert "Traceback" not in text and "timeout graceful shutdown exceeded" not in text, text
    assert "cancelling 2 request(s) still generating" in text, text


# -- fastpar run --------------------------------------------------------------------------------------

def test_batch_file_interrupted_and_resumed(model, tmp_path):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    lines = []
    for i in range(500):
        if i % 2:
            body = {"model": "m", "messages": [{"role": "user", "content": f"Say the number {i}."}],
                    "max_tokens": 4, "temperature": 0}
            url = "/v1/chat/completions"
        else:
            body = {"model": "m", "prompt": f"{i} + {i} =", "max_tokens": 4, "temperature": 0}
            url = "/v1/completions"
        lines.append(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": url, "body": body}))
    lines[100] = '{"custom_id": "broken", "body": '  # not JSON
    lines[300] = json.dumps({"custom_id": "r300", "method": "POST", "url": "/v1/completions",
                             "body": {"prompt": "x", "temperature": -1}})
    src.write_text("\n".join(lines) + "\n")
    cmd = [sys.executable, "-m", "fastpar", "run", str(src), "-o", str(out), "--model", model.path,
           "--n-parallel", "16", "--n-ctx-per-seq", "128", "--n-gpu-layers", str(N_GPU_LAYERS), "--quiet"]

    log = tmp_path / "first.log"
    with open(log, "w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.monotonic() + 300
        while not (out.exists() and out.read_bytes().count(b"\n") >= 200):
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline
            time.sleep(0.02)
    finally:
        proc.kill()  # mid-file, as a crash would
        proc.wait()
    n_first = out.read_bytes().count(b"\n")
    assert n_first < 498

    rerun = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 1, rerun.stderr  # two lines failed
    records = [json.loads(x) for x in out.read_text().splitlines()]
    ok = [r for r in records if r["response"] and r["response"]["status_code"] == 200]
    errors = [r for r in records if r["response"] is None or r["response"]["status_code"] != 200]
    assert sorted(r["custom_id"] for r in ok) == sorted(f"r{i}" for i in range(500) if i not in (100, 300))
    assert len(errors) == 2
    assert {(r["custom_id"], r["error"]["line"]) for r in errors} == {(None, 101), ("r300", 301)}
    assert "temperature" in next(r for r in errors if r["custom_id"] == "r300")["error"]["message"]
    for r in ok:
        body = r["response"]["body"]
        assert body["usage"]["completion_tokens"] >= 1 and body["choices"][0]["finish_reason"] in ("stop", "length")
    # The lines that cannot be read were written first (before any generation), and failed
    # lines are tried again: already done, the first run's answers.
    assert f"{498 - (n_first - 2)} answered, 2 failed, {n_first - 2} already in {out}" in rerun.stderr, \
        (n_first, rerun.stderr)
    # a third run has nothing left but the two failed lines, which fail again: one record each
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert again.returncode == 1 and out.read_text().count("\n") == len(records)
    assert again.stderr.splitlines()[-1].startswith(f"0 answered, 2 failed, 498 already in {out}")


def _batch_line(custom_id: str, max_tokens: int = 2, **body) -> str:
    body = {"prompt": f"Say {custom_id}:", "max_tokens": max_tokens, "temperature": 0, **body}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/completions", "body": body})


def _batch_cmd(model, src, out, *options: str) -> list:
    return [sys.executable, "-m", "fastpar", "run", str(src), "-o", str(out), "--model", model.path,
            "--n-gpu-layers", str(N_GPU_LAYERS), "--quiet", *options]


def _records(out) -> dict:
    """The output's records by custom_id (asserting one each)."""
    records = [json.loads(x) for x in out.read_text().splitlines()]
    by_id = {r["custom_id"]: r for r in records}
    assert len(by_id) == len(records), [r["custom_id"] for r in records]
    return by_id


def test_batch_lines_take_the_constraints_and_token_options(model, tmp_path):
    """fastpar run answers lines with logit_bias, allowed_token_ids, guided_regex and
    guided_choice as the server does: no 400s, each output as asked."""
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    yes, no = (model.tokenize(w, add_special=False)[0] for w in (" yes", " no"))
    chat = [{"role": "user", "content": "Give me a number."}]
    bodies = {"bias": ("/v1/completions", {"prompt": "Answer:", "max_tokens": 3, "logit_bias": {str(yes): 100}}),
              "allowed": ("/v1/completions", {"prompt": "Answer:", "max_tokens": 4, "allowed_token_ids": [yes, no]}),
              "regex": ("/v1/chat/completions", {"messages": chat, "max_tokens": 16, "guided_regex": r"\d{3}"}),
              "choice": ("/v1/chat/completions", {"messages": chat, "max_tokens": 8, "guided_choice": ["one", "two"]})}
    src.write_text("".join(json.dumps({"custom_id": k, "method": "POST", "url": url, "body": {"model": "m", **body}})
                           + "\n" for k, (url, body) in bodies.items()))
    run = subprocess.run([sys.executable, "-m", "fastpar", "run", str(src), "-o", str(out), "--model", model.path,
                          "--n-parallel", "4", "--n-ctx-per-seq", "128", "--n-gpu-layers", str(N_GPU_LAYERS),
                          "--quiet"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    got = {}
    for r in map(json.loads, out.read_text().splitlines()):
        assert r["response"]["status_code"] == 200, r
        choice = r["response"]["body"]["choices"][0]
        got[r["custom_id"]] = choice["message"]["content"] if "message" in choice else choice["text"]
    assert got["bias"] == " yes" * 3
    assert re.fullmatch(r"( yes| no){4}", got["allowed"]), got
    assert re.fullmatch(r"\d{3}", got["regex"]) and got["choice"] in ("one", "two"), got


def test_batch_failed_lines_are_retried_once_fixed(model, tmp_path):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    good, bad, broken = _batch_line("a"), _batch_line("b", temperature=-1), '{"custom_id": "c" "body": {}}'
    src.write_text("\n".join([good, bad, broken]) + "\n")
    cmd = _batch_cmd(model, src, out, "--n-parallel", "2", "--n-ctx-per-seq", "128")
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert first.returncode == 1, first.stderr
    assert first.stderr.splitlines()[-1].startswith(f"1 answered, 2 failed, 0 already in {out}"), first.stderr
    records = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(records) == 3
    errors = {r["error"]["line"]: r["error"]["message"] for r in records if r["error"]}
    assert "temperature" in errors[2]
    # the line of the file, and the column within it (not the JSON parser's "line 1")
    assert errors[3] == "line 3 of in.jsonl is not valid JSON: Expecting ',' delimiter at column 19"

    # fixed, under the same custom_ids: answered, each once in the output (a line may bias tokens)
    src.write_text("\n".join([good, _batch_line("b"), _batch_line("c", logit_bias={"42": 100})]) + "\n")
    rerun = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert rerun.stderr.splitlines()[-1] == f"2 answered, 0 failed, 1 already in {out}", rerun.stderr
    by_id = _records(out)
    assert sorted(by_id) == ["a", "b", "c"]
    assert all(r["error"] is None and r["response"]["status_code"] == 200 for r in by_id.values()), by_id
    assert by_id["c"]["response"]["body"]["choices"][0]["text"] == model.token_bytes(42).decode() * 2


def test_batch_interrupted_by_ctrl_c_keeps_only_finished_lines(model, tmp_path):
    src, out, log = tmp_path / "in.jsonl", tmp_path / "out.jsonl", tmp_path / "first.log"
    ids = [f"r{i}" for i in range(16)]
    # Two slots and 32 tokens each: eight waves, still running when the first lines are in.
    src.write_text("".join(_batch_line(i, max_tokens=32, ignore_eos=True) + "\n" for i in ids))
    cmd = _batch_cmd(model, src, out, "--n-parallel", "2", "--n-ctx-per-seq", "64")
    with open(log, "w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.monotonic() + 120
        while not (out.exists() and b"\n" in out.read_bytes()):
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "no line was answered"
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        status = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # Only finished answers were written, never a line the interrupt cut short.
    first = _records(out)
    assert 0 < len(first) < len(ids)
    for r in first.values():
        assert r["response"]["status_code"] == 200, r
        assert r["response"]["body"]["choices"][0]["finish_reason"] == "length", r
    text = log.read_text()
    assert "Traceback" not in text, text
    assert status == 130, text
    assert text.splitlines()[-1] == (f"fastpar: interrupted: {len(first)} answered, 0 failed, {len(ids) - len(first)} "
                                     "left; rerun the same command to finish"), text

    rerun = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert rerun.stderr.splitlines()[-1] == f"{len(ids) - len(first)} answered, 0 failed, {len(first)} already in {out}"
    by_id = _records(out)
    assert sorted(by_id) == sorted(ids)
    assert all(r["response"]["status_code"] == 200 for r in by_id.values())
    assert all(by_id[i] == first[i] for i in first)  # kept as they were


# -- a client nobody here wrote: lm-evaluation-harness ---------------------------------------------

def test_lm_eval_harness_local_completions(url, engine, tmp_path, monkeypatch):
    lm_eval = pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")  # the task's data is a local file
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf"))
    prompts = ["The capital of France is", "Water boils at", "The three primary colors are", "In 1969, humans",
               "The largest planet in the solar system is", "A good name for a cat is"]
    # On a GPU a prompt decoded beside others rounds apart from one decoded alone (conftest's
    # GREEDY says why): there the harness sends one request at a time, as the answers were made.
    NUM_CONCURRENT = 1 if ON_GPU else 4
    # Half the targets are what the model answers (greedy, up to a newline), half are not:
    # the harness must score exactly 0.5 from the server's answers.
    answers = [engine.generate(p, max_tokens=8, temperature=0.0, stop=["\n"]).text for p in prompts]
    docs = [{"prompt": p, "target": a if i % 2 == 0 else a + " (not this)"}
            for i, (p, a) in enumerate(zip(prompts, answers))]
    (tmp_path / "qa.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (tmp_path / "fastpar_qa.yaml").write_text(f"""task: fastpar_qa
dataset_path: json
dataset_kwargs:
  data_files:
    test: {tmp_path / "qa.jsonl"}
test_split: test
output_type: generate_until
doc_to_text: "{{{{prompt}}}}"
doc_to_target: "{{{{target}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 8
  do_sample: false
  temperature: 0
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
""")
    out = lm_eval.simple_evaluate(
        model="local-completions",
        model_args={"base_url": url + "/v1/completions", "model": "smol", "tokenizer_backend": None,
                    "tokenized_requests": False, "num_concurrent": NUM_CONCURRENT, "max_retries": 1},
        tasks=["fastpar_qa"], task_manager=TaskManager(include_path=str(tmp_path)), log_samples=True)
    samples = out["samples"]["fastpar_qa"]
    got = {s["doc"]["prompt"]: s["resps"][0][0] for s in samples}
    assert got == dict(zip(prompts, answers))
    assert out["results"]["fastpar_qa"]["exact_match,none"] == 0.5
