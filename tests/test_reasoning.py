"""Thinking models' thoughts (SamplingParams(reasoning=...)): the split of <think>...</think>
from the answer, constraints applied to the answer after the thought, thinking turned off,
and the server's reasoning_content, streamed and not. The default model does not think on
its own; a few examples of thinking in the prompt make it write a short thought, greedy."""

from __future__ import annotations

import json
import random
import re

import jsonschema
import openai
import pytest

import fastpar
from fastpar.server import create_app
from fastpar.server.reasoning import BLANKS, ThoughtSplit

from gguf_mutants import Base, T
from conftest import N_GPU_LAYERS
from test_server import running

SHOTS = "".join(f"Q: What is {a}+{b}?\n<think>{a} plus {b} is {a + b}.</think>\nA: {a + b}\n\n"
                for a, b in ((2, 3), (4, 4), (1, 6)))
CHAT_SHOTS = [m for a, b in ((2, 3), (4, 4), (1, 6))
              for m in ({"role": "user", "content": f"What is {a}+{b}?"},
                        {"role": "assistant", "content": f"<think>{a} plus {b} is {a + b}.</think>\n{a + b}"})]
QUESTIONS = ["What is 3+3?", "What is 2+2?", "What is 5+1?"]
SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}


def reference_split(text: str, opened: bool):
    """The split the core makes (csrc/core/structured/reasoning.hpp), written again."""
    start = 0
    if not opened:
        rest = text.lstrip(BLANKS)
        if not rest.startswith("<think>"):
            return "", text
        start = len(text) - len(rest) + len("<think>")
    end = text.find("</think>", start)
    if end < 0:
        return text[start:].strip(BLANKS), ""
    return text[start:end].strip(BLANKS), text[end + len("</think>"):].lstrip(BLANKS)


def streamed(text: str, opened: bool, rng: random.Random):
    """`text` through a ThoughtSplit in random pieces, the deltas joined."""
    cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(0, 6))))
    pieces = [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]
    split, reasoning, content = ThoughtSplit(opened), "", ""
    for i, piece in enumerate(pieces):
        r, c = split.feed(piece, final=i == len(pieces) - 1)
        reasoning, content = reasoning + r, content + c
    return reasoning, content


@pytest.fixture(scope="module")
def ctx(model):
    return fastpar.Context(model, n_parallel=4, n_ctx_per_seq=512)


def test_the_thought_is_split_off_and_the_constraint_applies_after_it(ctx):
    rng = random.Random(3)
    # The last two prompts leave a thought open, as templates that always think do.
    prompts = [SHOTS + "Q: What is 3+3?\n", SHOTS + "Q: What is 2+2?\n<think>", SHOTS + "Q: What is 5+1?\n<think>"]
    greedy = dict(temperature=0.0, max_tokens=32, stop=["\n\n"], progress=False)
    raw = fastpar.generate_parallel(ctx, prompts, **greedy)
    split = fastpar.generate_parallel(ctx, prompts, reasoning="split", **greedy)
    for i, (r, s) in enumerate(zip(raw, split)):
        assert r.reasoning == "" and r.token_ids == s.token_ids
        assert s.reasoning and "think>" not in s.reasoning + s.text, (r.text, s.reasoning, s.text)
        assert (s.reasoning, s.text) == reference_split(r.text, i > 0)
        for _ in range(20):  # the server's streamed split gives the core's
            assert streamed(r.text, i > 0, rng) == (s.reasoning, s.text)
    # The constraint holds the answer alone; the thought before it is free text.
    for c in fastpar.generate_parallel(ctx, prompts, reasoning="split", regex=r"A: \d{1,2}", temperature=0.0,
                                       max_tokens=48, progress=False):
        assert c.finish_reason == "stop" and c.reasoning and re.fullmatch(r"A: \d{1,2}", c.text), c
    chats = [CHAT_SHOTS + [{"role": "user", "content": q}] for q in QUESTIONS]
    for c in fastpar.generate_parallel(ctx, chats, reasoning="split", json_schema=SCHEMA, temperature=0.0,
                                       max_tokens=64, progress=False):
        assert c.finish_reason == "stop" and c.reasoning, c
        jsonschema.validate(json.loads(c.text), SCHEMA)
    # A thought the prompt opened must come first, even where the answer's grammar allows
    # none: at temperature 1 every output still has one.
    for c in fastpar.generate_parallel(ctx, [prompts[1]] * 8, reasoning="split", choice=["A: 4", "A: 5"],
                                       temperature=1.0, seed=2, max_tokens=64, progress=False):
        assert c.text in ("A: 4", "A: 5") or c.finish_reason == "length", c
    # A thought never closed is all reasoning, and no answer.
    (c,) = fastpar.generate_parallel(ctx, [prompts[1]], reasoning="split", temperature=0.0, max_tokens=3,
                                     progress=False)
    assert c.finish_reason == "length" and c.reasoning and c.text == ""


def test_thinking_off_closes_an_empty_thought_after_a_chat_prompt(ctx, model):
    chats = [CHAT_SHOTS + [{"role": "user", "content": q}] for q in QUESTIONS]
    out = fastpar.generate_parallel(ctx, chats, reasoning="off", temperature=0.0, max_tokens=24, progress=False)
    for chat, c in zip(chats, out):
        closed = model.apply_chat_template(chat) + "<think>\n\n</think>\n\n"
        assert c.n_prompt_tokens + c.n_prompt_tokens_shared + c.n_prompt_tokens_cached == len(model.tokenize(closed))
        assert "<think>" not in c.text and c.reasoning == ""
    with pytest.raises(ValueError, match="reasoning"):
        fastpar.generate_parallel(ctx, ["x"], reasoning="maybe")


def test_streamed_split_equals_the_whole_texts_split():
    """ThoughtSplit against the split written again, over random texts cut at random."""
    rng = random.Random(1)
    atoms = ["<think>", "</think>", "<", "</th", "ink>", " ", "\n", "a", "b c", "{x}", "<thi", "nk>"]
    for _ in range(5000):
        opened = rng.random() < 0.5
        text = "".join(rng.choice(atoms) for _ in range(rng.randint(0, 10)))
        assert streamed(text, opened, rng) == reference_split(text, opened), (text, opened)


@pytest.fixture(scope="module")
def thinking_url(model, tmp_path_factory):
    """A server of the default model with a chat template that thinks (it mentions <think>)."""
    base = Base.read(model.path)
    g = base.gguf.copy()
    g.set("tokenizer.chat_template", T.STRING, model.chat_template.replace("<|im_start|>assistant\n",
                                                                         "<|im_start|>assistant\n<think>\n"))
    path = tmp_path_factory.mktemp("thinking") / "thinking.gguf"
    Base(g).write(path)
    thinking = fastpar.Model(str(path), n_gpu_layers=N_GPU_LAYERS)
    assert "<think>" in thinking.chat_template
    with fastpar.Engine(thinking, n_parallel=4, n_ctx_per_seq=512) as engine, \
            running(create_app(engine, model_name="thinker")) as url:
        yield url


@pytest.fixture
def client(thinking_url):
    with openai.OpenAI(base_url=thinking_url + "/v1", api_key="unused", max_retries=0) as c:
        yield c


def test_server_returns_reasoning_content(client):
    messages = CHAT_SHOTS + [{"role": "user", "content": QUESTIONS[0]}]
    whole = client.chat.completions.create(model="thinker", messages=messages, max_tokens=32, temperature=0)
    message = whole.choices[0].message
    assert message.model_extra.get("reasoning_content") and "think>" not in message.content, message
    stream = client.chat.completions.create(model="thinker", messages=messages, max_tokens=32, temperature=0,
                                            stream=True)
    reasoning = content = ""
    for chunk in stream:
        if chunk.choices:
            reasoning += chunk.choices[0].delta.model_extra.get("reasoning_content") or ""
            content += chunk.choices[0].delta.content or ""
    assert (reasoning, content) == (message.model_extra["reasoning_content"], message.content)
    off = client.chat.completions.create(model="thinker", messages=messages, max_tokens=32, temperature=0,
                                         extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert "reasoning_content" not in off.choices[0].message.model_extra and "<think>" not in off.choices[0].message.content
    kept = client.chat.completions.create(model="thinker", messages=messages, max_tokens=32, temperature=0,
                                          extra_body={"reasoning_format": "none"})
    assert "</think>" in kept.choices[0].message.content
    for extra, param in (({"reasoning_format": "x"}, "reasoning_format"),
                         ({"chat_template_kwargs": {"enable_thinking": "no"}}, "chat_template_kwargs"),
                         ({"chat_template_kwargs": []}, "chat_template_kwargs")):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="thinker", messages=messages, max_tokens=4, extra_body=extra)
        assert e.value.param == param, e.value.body
