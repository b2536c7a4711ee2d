"""Tool calls (SamplingParams(tools=...), the server's tools/tool_choice): prompts rendered
by the model's Jinja template through llama.cpp's chat library, calls parsed back out as
llama-server parses them, the generic format for a template without tools (the default
model's), forced calls whose arguments always validate, and every door: Python, the
Engine, the server (streamed and not, with the official openai client) and fastpar run."""

from __future__ import annotations

import json
import pathlib
import random
import subprocess
import sys

import httpx
import jsonschema
import openai
import pytest

import fastpar
from fastpar.server import create_app

from conftest import N_GPU_LAYERS, ON_GPU
from gguf_mutants import Base, T
from llama_tools import llama_server
from test_server import running

TEMPLATES = pathlib.Path(__file__).resolve().parents[1] / "vendor" / "llama.cpp" / "models" / "templates"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Get the local time of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


def shots(cities=("London", "Rome", "Berlin")):
    """Earlier turns in which the assistant called get_weather and read its result: they
    lead a small model to call it again. Ids of 9 letters and digits, as Mistral's
    template requires."""
    out = []
    for i, city in enumerate(cities):
        out += [{"role": "user", "content": f"What is the weather in {city}?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": f"call{i}abcd", "type": "function",
                     "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}]},
                {"role": "tool", "tool_call_id": f"call{i}abcd", "content": "sunny"},
                {"role": "assistant", "content": f"It is sunny in {city}."}]
    return out + QUESTION


def random_function(rng: random.Random, i: int) -> dict:
    kinds = [{"type": "string", "maxLength": 24}, {"type": "integer"}, {"type": "number"}, {"type": "boolean"},
             {"type": "string", "enum": ["red", "green", "blue"]},
             {"type": "array", "items": {"type": "integer"}, "maxItems": 3},
             {"type": "object", "properties": {"name": {"type": "string", "maxLength": 16}}, "required": ["name"]}]
    names = rng.sample(["city", "count", "price", "flag", "color", "ids", "owner", "note", "limit"], rng.randint(1, 4))
    props = {n: rng.choice(kinds) for n in names}
    required = rng.sample(names, rng.randint(1, len(names)))
    return {"type": "function", "function": {"name": f"tool_{i}", "description": f"Tool number {i}",
                                             "parameters": {"type": "object", "properties": props,
                                                            "required": required}}}


@pytest.fixture(scope="module")
def ctx(model):
    return fastpar.Context(model, n_parallel=8, n_ctx_per_seq=2048)


def test_the_default_model_calls_tools_in_the_generic_format(ctx, model):
    assert not model._model.native_tools  # its template does not describe tools
    [c] = fastpar.generate_parallel(ctx, [QUESTION], tools=[WEATHER], tool_choice="required", max_tokens=64,
                                    temperature=0)
    assert c.finish_reason == "tool_calls" and c.text == ""
    [call] = c.tool_calls
    assert call.name == "get_weather" and json.loads(call.arguments)["city"] == "Paris"
    assert call.id.startswith("call_") and len(call.id) == 29
    assert c.to_dict()["tool_calls"] == [{"id": call.id, "name": "get_weather", "arguments": call.arguments}]
    # A named function, and "none": no call, plain text.
    [named] = fastpar.generate_parallel(ctx, [QUESTION], tools=[WEATHER, TIME],
                                        tool_choice={"type": "function", "function": {"name": "get_time"}},
                                        max_tokens=64, temperature=0)
    assert [t.name for t in named.tool_calls] == ["get_time"]
    [none] = fastpar.generate_parallel(ctx, [QUESTION], tools=[WEATHER], tool_choice="none", max_tokens=8,
                                       temperature=0)
    # The Jinja template rendered without tools (it adds SmolLM's default system prompt,
    # which llama.cpp's built-in chatml rendering of plain chat prompts does not).
    rendered = model._model.render_chat(json.dumps(QUESTION)).prompt
    [plain] = fastpar.generate_parallel(ctx, [rendered], max_tokens=8, temperature=0)
    assert none.tool_calls == [] and none.text == plain.text


def test_required_calls_over_100_random_schemas_always_validate(ctx):
    rng = random.Random(7)
    tools = [[random_function(rng, 3 * i + j) for j in range(rng.randint(1, 3))] for i in range(100)]
    params = [fastpar.SamplingParams(tools=t, tool_choice="required", temperature=1.0, top_k=0, top_p=1.0, min_p=0.0,
                                     max_tokens=400, seed=i) for i, t in enumerate(tools)]
    prompts = [[{"role": "user", "content": f"Use one of the tools for request {i}."}] for i in range(100)]
    for c, t in zip(fastpar.generate_parallel(ctx, prompts, params), tools):
        assert c.finish_reason == "tool_calls", (c.finish_reason, c.text[-200:])
        [call] = c.tool_calls
        [fn] = [f["function"] for f in t if f["function"]["name"] == call.name]
        jsonschema.validate(json.loads(call.arguments), fn["parameters"])


def test_a_forced_call_does_not_depend_on_its_batch_mates(model):
    """Four copies of one forced call, seeded alike: the grammar's allowed sets, which the
    first copy to reach a state computes and the others read, choose what masking would, so
    the copies are identical. share_prefixes=False: a copied prefix of 64 tokens or more
    rounds apart from a decoded one (docs/internals.md, "Prefix sharing"). On a GPU rows of
    one batch can round apart too, so there the calls are only checked to be calls."""
    ctx = fastpar.Context(model, n_parallel=4, n_ctx_per_seq=1024, share_prefixes=False)
    for temperature in (0.0, 0.9):
        out = fastpar.generate_parallel(ctx, [QUESTION] * 4, tools=[WEATHER], tool_choice="required",
                                        max_tokens=64, temperature=temperature, seed=181)
        assert all(c.finish_reason == "tool_calls" and c.tool_calls[0].name == "get_weather" for c in out)
        if not ON_GPU:
            assert all(c.token_ids == out[0].token_ids for c in out), [len(c.token_ids) for c in out]


def test_parallel_calls_and_a_later_turn_with_the_results(ctx):
    [c] = fastpar.generate_parallel(ctx, [QUESTION], tools=[WEATHER, TIME], tool_choice="required",
                                    parallel_tool_calls=True, max_tokens=128, temperature=0)
    assert c.finish_reason == "tool_calls" and len(c.tool_calls) >= 1
    turn = QUESTION + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": t.id, "type": "function", "function": {"name": t.name, "arguments": t.arguments}}
        for t in c.tool_calls]}] + [{"role": "tool", "tool_call_id": t.id, "content": "sunny, 21 C"}
                                    for t in c.tool_calls]
    [answer] = fastpar.generate_parallel(ctx, [turn], tools=[WEATHER, TIME], max_tokens=48, temperature=0)
    assert answer.finish_reason in ("stop", "length", "tool_calls")


def test_bad_tools_are_refused_before_any_work(ctx):
    with pytest.raises(ValueError, match="tool_choice names function 'nope'"):
        fastpar.SamplingParams(tools=[WEATHER], tool_choice="nope")
    with pytest.raises(ValueError, match="tool_choice was given without tools"):
        fastpar.SamplingParams(tool_choice="required")
    with pytest.raises(TypeError, match=r"tools\[0\]"):
        fastpar.SamplingParams(tools=[{"type": "function"}])
    with pytest.raises(ValueError, match="tools cannot be combined with json_schema"):
        fastpar.SamplingParams(tools=[WEATHER], json_schema={"type": "object"})
    with pytest.raises(TypeError, match="list of chat messages"):
        fastpar.generate_parallel(ctx, ["plain text"], tools=[WEATHER])


def test_malformed_calls_come_back_as_text(model):
    """A reply that is not a well-formed call is the answer's text, whatever the format."""
    for prompt_tools in ([WEATHER], []):
        render = model._model.render_chat(json.dumps(QUESTION), json.dumps(prompt_tools), "auto", False)
        for text in ('{"tool_call": {"name": "get_weather", "arguments": {"city": ', "{not json", "Hello there",
                     '{"tool_call": {"arguments": {}}}', ""):
            reply = fastpar._core.parse_reply(render.parser, text)
            assert reply.tool_calls == [] and reply.content == text, (text, reply)


FORMATS = {"hermes": "Qwen-Qwen2.5-7B-Instruct", "llama3": "meta-llama-Llama-3.1-8B-Instruct",
           "mistral": "mistralai-Mistral-Nemo-Instruct-2407"}


@pytest.fixture(scope="module", params=sorted(FORMATS))
def templated(request, model, tmp_path_factory):
    """The default model with the chat template of one tool-call format."""
    base = Base.read(model.path)
    g = base.gguf.copy()
    g.set("tokenizer.chat_template", T.STRING, (TEMPLATES / f"{FORMATS[request.param]}.jinja").read_text())
    path = tmp_path_factory.mktemp("tools") / f"{request.param}.gguf"
    Base(g).write(path)
    m = fastpar.Model(str(path), n_gpu_layers=N_GPU_LAYERS)
    assert m._model.native_tools
    return request.param, m


# A well-formed call written in each format, as a model trained on it writes one.
WRITTEN = {"hermes": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
           "llama3": '{"name": "get_weather", "parameters": {"city": "Paris"}}',
           "mistral": '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "abcdefghi"}]'}


def test_each_format_reads_a_call_written_in_it(templated):
    """The parser of each format (auto and required) reads a call written in it, which the
    135M model does not write for Mistral (test below): name, arguments and the id the
    model gave, no text besides."""
    name, model = templated
    for choice in ("auto", "required"):
        render = model._model.render_chat(json.dumps(QUESTION), json.dumps([WEATHER]), choice, False)
        reply = fastpar._core.parse_reply(render.parser, WRITTEN[name])
        assert [(t.name, json.loads(t.arguments)) for t in reply.tool_calls] == [("get_weather", {"city": "Paris"})]
        assert reply.content == "" and reply.tool_calls[0].id == ("abcdefghi" if name == "mistral" else "")


@pytest.mark.skipif(ON_GPU, reason="greedy text compared token for token with the CPU's llama-server")
def test_forced_calls_parse_as_llama_server_parses_them(templated):
    """tool_choice "required" forces a call through the format's grammar (after any text
    the format allows first); the text and the parsed calls equal llama-server's (--jinja,
    the same model and request, greedy). With Hermes' format the 135M model writes a call
    after the shots. Llama 3.x's and Mistral's grammars let text come first, and there it
    may write text: it never writes Mistral's [TOOL_CALLS] marker, and whether it writes a
    Llama 3.x call depends on the CPU's rounding (a call on an AVX2 CPU, text on an
    AVX-512 one, where llama-server writes the same text). So for those two formats the
    check is the equality; test_each_format_reads_a_call_written_in_it reads their calls."""
    name, model = templated
    ctx = fastpar.Context(model, n_parallel=2, n_ctx_per_seq=4096, n_threads=2)
    body = {"messages": shots(), "tools": [WEATHER], "tool_choice": "required", "max_tokens": 60, "temperature": 0}
    [c] = fastpar.generate_parallel(ctx, [body["messages"]], tools=[WEATHER], tool_choice="required", max_tokens=60,
                                    temperature=0)
    with llama_server(model.path, "--jinja", "-np", "1", "-c", "4096", "-t", "2") as url:
        theirs = httpx.post(url + "/v1/chat/completions", json=body, timeout=300).json()["choices"][0]
    calls = [(t["function"]["name"], t["function"]["arguments"]) for t in theirs["message"].get("tool_calls") or []]
    assert [(t.name, t.arguments) for t in c.tool_calls] == calls
    assert c.finish_reason == theirs["finish_reason"]
    assert (c.text or None) == (theirs["message"]["content"] or None)
    if name == "hermes":
        assert c.finish_reason == "tool_calls" and calls and calls[0][0] == "get_weather"


def test_the_engine_takes_tools(model):
    with fastpar.Engine(model, n_parallel=2, n_ctx_per_seq=1024) as engine:
        request = engine.submit(QUESTION, tools=[WEATHER], tool_choice="required", max_tokens=64, temperature=0)
        assert request.has_tools
        c = request.result()
        assert c.finish_reason == "tool_calls" and c.tool_calls[0].name == "get_weather"


@pytest.fixture(scope="module")
def client(model):
    with fastpar.Engine(model, n_parallel=4, n_ctx_per_seq=1024) as engine, \
            running(create_app(engine, model_name="smol")) as url, \
            openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as c:
        yield c


def test_the_server_answers_tool_calls_streamed_and_not(client):
    kwargs = dict(model="smol", messages=QUESTION, tools=[WEATHER, TIME], tool_choice="required", max_tokens=64,
                  temperature=0)
    whole = client.chat.completions.create(**kwargs)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.function.name in ("get_weather", "get_time")
    args, name, ids, finish = {}, None, set(), None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for d in chunk.choices:
            finish = d.finish_reason or finish
            for t in d.delta.tool_calls or []:
                ids.add(t.id) if t.id else None
                name = t.function.name or name
                args[t.index] = args.get(t.index, "") + (t.function.arguments or "")
    assert finish == "tool_calls" and len(ids) == 1 and name == call.function.name
    assert args == {0: call.function.arguments}
    # The results in a later turn, and a named function.
    later = QUESTION + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                        {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
    again = client.chat.completions.create(model="smol", messages=later, tools=[WEATHER, TIME], max_tokens=32,
                                           temperature=0,
                                           tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert again.choices[0].message.tool_calls[0].function.name == "get_time"


def test_the_server_refuses_bad_tools_with_400s(client):
    for extra, param in (({"tools": "x"}, "tools"), ({"tools": [WEATHER], "tool_choice": "nope"}, "tool_choice"),
                         ({"tool_choice": "required"}, "tool_choice"),
                         ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls")):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="smol", messages=QUESTION, max_tokens=4, extra_body=extra)
        assert e.value.body["param"] == param, (extra, e.value.body)


def test_batch_lines_take_tools(model, tmp_path):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    body = {"model": "m", "messages": QUESTION, "tools": [WEATHER], "tool_choice": "required", "max_tokens": 64,
            "temperature": 0, "logit_bias": {"0": -100}}
    src.write_text(json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": body}) + "\n")
    run = subprocess.run([sys.executable, "-m", "fastpar", "run", str(src), "-o", str(out), "--model", model.path,
                          "--n-parallel", "2", "--n-ctx-per-seq", "1024", "--n-gpu-layers", str(N_GPU_LAYERS),
                          "--quiet"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    [record] = map(json.loads, out.read_text().splitlines())
    assert record["response"]["status_code"] == 200, record
    choice = record["response"]["body"]["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
