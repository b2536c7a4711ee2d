"""Structured output: json_schema and grammar constrain each prompt's output (docs/api.md)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import jsonschema
import pytest

import fastpar
from fastpar import _core, _testing

from extraction_task import TICKET_SCHEMA, TICKETS  # shared with bench/bench_structured.py


def params(**kw) -> _core.GenerateParams:
    p = _core.GenerateParams()
    for k, v in kw.items():
        setattr(p, k, v)
    return p


def chat(text: str):
    return [_core.ChatMessage("user", text)]


@pytest.fixture(scope="module")
def ctx(model: fastpar.Model) -> fastpar.Context:
    return fastpar.Context(model, n_parallel=8, n_ctx_per_seq=512)


def test_schema_outputs_validate(ctx):
    prompts = [chat(f"Ticket: {TICKETS[i % len(TICKETS)]} (#{i}). Answer with the ticket's fields as JSON.")
               for i in range(32)]
    p = params(max_tokens=160, temperature=0.7, seed=7, json_schema=json.dumps(TICKET_SCHEMA))
    out = ctx._ctx.generate(prompts, [p], None)
    assert len(out) == 32
    for c in out:
        assert c.finish_reason == "stop", (c.finish_reason, c.text, c.error)
        jsonschema.validate(json.loads(c.text), TICKET_SCHEMA)


def test_enum_classification(ctx):
    labels = ["positive", "negative", "neutral"]
    schema = {"enum": labels}
    reviews = ["I love it", "Terrible, broke in a day", "It is a phone", "Best purchase ever", "Meh"] * 2
    p = params(max_tokens=16, temperature=1.0, seed=3, json_schema=json.dumps(schema))
    out = ctx._ctx.generate([chat(f"Sentiment of: {r}") for r in reviews], [p], None)
    assert all(c.finish_reason == "stop" and json.loads(c.text) in labels for c in out), [c.text for c in out]


def test_grammar_yes_no(ctx):
    p = params(max_tokens=8, temperature=1.0, seed=11, grammar='root ::= "yes" | "no"')
    out = ctx._ctx.generate([chat(q) for q in ["Is the sky blue?", "Is fire cold?", "Is 2 > 1?"] * 3], [p], None)
    assert all(c.finish_reason == "stop" and c.text in ("yes", "no") for c in out), [c.text for c in out]


def test_choice_outputs_are_exactly_the_labels(ctx):
    # Labels a GBNF literal must escape (a quote, a backslash, a newline) and one beyond ASCII;
    # sampled at temperature 1, so every label is reachable and none other may appear.
    labels = ["positive", "negative", 'a "quoted" one', "back\\slash\nnewline", "très bien"]
    prompts = [f"Review {i}: {'great' if i % 3 else 'awful'} product. Sentiment:" for i in range(200)]
    out = fastpar.generate_parallel(ctx, prompts, choice=labels, temperature=1.0, top_k=0, seed=5, max_tokens=16)
    assert all(c.finish_reason == "stop" and c.text in labels for c in out), {c.text for c in out} - set(labels)
    assert len({c.text for c in out}) >= 2  # sampled, not one forced answer
    greedy = fastpar.generate_parallel(ctx, prompts[:4], choice=["yes", "no"], temperature=0.0, max_tokens=4)
    assert all(c.text in ("yes", "no") for c in greedy)
    for bad, error, match in (({"choice": []}, ValueError, "choice is empty"),
                              ({"choice": "yes"}, TypeError, "list of str"),
                              ({"choice": ["a", ""]}, ValueError, r"choice\[1\] is empty"),
                              ({"choice": ["a"], "grammar": 'root ::= "a"'}, ValueError, "one constraint"),
                              ({"choice": ["a"], "json_schema": {"enum": ["a"]}}, ValueError, "one constraint")):
        with pytest.raises(error, match=match):
            fastpar.generate_parallel(ctx, prompts[:1], **bad)


# Regexes over what the subset holds: classes and shorthands (\d \w \s \S, ASCII), escaped
# punctuation the converter does not take itself (\/ \#), quotes, alternation, groups,
# counted repeats, optional anchors, text beyond ASCII. Bounded, so max_tokens never cuts one.
# The flag: the default model's outputs vary under it (others it finishes one way, as after
# "a/b#c" it always breaks the line).
REGEXES = [(r"\d{3}-\d{4}", True), (r"(yes|no|maybe)", False), (r"[A-Z][a-z]{2,8} \w{1,8}\.", True),
           (r"^https?://[a-z]{1,8}\.(com|org)/\S{0,6}$", True), (r"\(\d{1,3}\) \[ok\]", False),
           (r'"[^"\n]{1,10}"', True), (r"a\/b\#c\s?d", False), (r"(?:caf[eé] ){1,2}(au lait|noir)", True)]


@pytest.mark.parametrize("regex,varied", REGEXES)
def test_regex_outputs_match_whole(ctx, regex, varied):
    # Sampled at temperature 1 with no top-k, top-p or min-p: whatever the grammar lets through
    # is reachable, and every output must still match.
    prompts = [f"Example {i}: {'a phone number' if i % 2 else 'an answer'} is" for i in range(24)]
    out = fastpar.generate_parallel(ctx, prompts, regex=regex, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0,
                                    seed=9, max_tokens=48)
    assert all(c.finish_reason == "stop" for c in out), [(c.text, c.finish_reason) for c in out]
    assert all(re.fullmatch(regex, c.text) for c in out), [c.text for c in out if not re.fullmatch(regex, c.text)]
    assert len({c.text for c in out}) >= (2 if varied else 1)  # sampled, not one forced answer


def test_regexes_outside_the_subset_are_refused_naming_why(ctx):
    for regex, match in ((r"(?=a)b", "outside the supported subset"), (r"a\bb", "outside the supported subset"),
                         (r"(a)\1", "outside the supported subset"), (r"(?P<n>a)", "outside the supported subset"),
                         (r"a|^b", "outside the supported subset"), (r"(ab", "unbalanced parentheses"),
                         ("^$", "only the empty string"), (r"[\D]x", r"\\D inside a character class"),
                         ("ab\\", "lone backslash")):
        with pytest.raises(ValueError, match=match):
            fastpar.generate_parallel(ctx, ["x"], regex=regex, max_tokens=4)
    for bad, error, match in (({"regex": ""}, ValueError, "regex is empty"), ({"regex": 5}, TypeError, "regex must be"),
                              ({"regex": "a", "choice": ["a"]}, ValueError, "one constraint")):
        with pytest.raises(error, match=match):
            fastpar.generate_parallel(ctx, ["x"], **bad)


def test_invalid_grammar_fails_alone(model):
    good = params(max_tokens=6, temperature=0.0, grammar='root ::= [a-z]+ " " [0-9]')
    bad = params(max_tokens=6, temperature=0.0, grammar='root ::= ( "a" ')
    with fastpar.Engine(model, n_parallel=4, n_ctx_per_seq=256) as engine:
        handles = [engine._engine.submit(f"Word {i}:", bad if i == 3 else good, 0.0) for i in range(8)]
        out = [h.result(None)[0] for h in handles]  # the core's handle: a list of one sample
    assert out[3].finish_reason == "error" and "grammar does not compile" in out[3].error
    assert out[3].text == ""  # never generated without its grammar
    for i, c in enumerate(out):
        if i != 3:
            assert c.finish_reason in ("stop", "length") and not c.error, c.error
            assert c.text and all(ch.islower() or ch.isdigit() or ch == " " for ch in c.text), c.text


@pytest.mark.parametrize("schema, named", [
    ({"type": "string", "format": "email"}, "email"),
    ({"oneOf": [{"type": "string"}, {"type": "integer"}]}, "oneOf"),
    ({"type": "object", "properties": {"a": {"not": {"type": "null"}}}}, "not"),
    ({"type": "integer", "multipleOf": 5}, "multipleOf"),
    ({"type": "string", "pattern": "[a-z]+"}, "pattern"),
])
def test_unsupported_schema_feature_raises(ctx, schema, named):
    with pytest.raises(ValueError, match=named):
        ctx._ctx.generate(["x"], [params(json_schema=json.dumps(schema))], None)


def test_schema_not_json_and_both_constraints_raise(ctx):
    with pytest.raises(ValueError, match="not valid JSON"):
        ctx._ctx.generate(["x"], [params(json_schema="{nope")], None)
    with pytest.raises(ValueError, match="give one of them"):
        ctx._ctx.generate(["x"], [params(json_schema='{"type":"string"}', grammar='root ::= "a"')], None)


def test_dead_end_errors_that_prompt_only(model):
    # After "a" the grammar wants a character no character is: no token can follow.
    dead = params(max_tokens=8, temperature=0.0, grammar='root ::= "a" [^\\x00-\\U0010FFFF]')
    fine = params(max_tokens=8, temperature=0.0, grammar='root ::= "ok"')
    with fastpar.Engine(model, n_parallel=2, n_ctx_per_seq=256) as engine:
        handles = [engine._engine.submit("Say:", p, 0.0) for p in (fine, dead, fine)]
        out = [h.result(None)[0] for h in handles]  # the core's handle: a list of one sample
    assert out[1].finish_reason == "error" and "dead end" in out[1].error and out[1].text == "a"
    assert [out[0].text, out[2].text] == ["ok", "ok"]


def test_bounded_number_stays_in_bounds(ctx):
    schema = {"type": "object", "properties": {"t": {"type": "number", "minimum": -3, "maximum": 7.5}},
              "required": ["t"]}
    out = ctx._ctx.generate([chat(f"Temperature #{i} as JSON") for i in range(4)],
                            [params(max_tokens=32, temperature=1.0, seed=5, json_schema=json.dumps(schema))], None)
    for c in out:
        jsonschema.validate(json.loads(c.text), schema)


def test_constrained_rows_are_whole_on_the_device():
    """A constrained request never takes device sampling's cut-down rows (the grammar may
    allow none of their candidates): DeviceSampling::serves decides, and says no."""
    greedy = params(temperature=0.0)
    assert _testing.device_serves(greedy)
    assert not _testing.device_serves(params(temperature=0.0, json_schema='{"type":"string"}'))
    assert not _testing.device_serves(params(temperature=0.0, grammar='root ::= "a"'))
    assert not _testing.device_serves(params(temperature=0.0, choice=["yes", "no"]))


def test_grammar_costs_hook(model):
    tokens = model._model.tokenize('{"category": "bug", "priority": 2, "summary": "crash", "urgent": true, "tags": []}')
    costs = _testing.measure_grammar(model._model, params(json_schema=json.dumps(TICKET_SCHEMA)), tokens)
    assert costs["n_allowed_first"] >= 1 and costs["mask_ms"] > costs["check_ms"] > 0
    with pytest.raises(ValueError, match="does not allow"):
        _testing.measure_grammar(model._model, params(grammar='root ::= "x"'), model._model.tokenize("y"))


def test_random_schemas_and_grammars_never_kill_the_process():
    """100 random constraints in a child process: it must exit normally, every
    unsupported schema rejected, and every finished schema output valid. bench/bench_structured.py
    --fuzz runs more (bench/results/design-measurements.md quotes the count)."""
    script = os.path.join(os.path.dirname(__file__), "structured_fuzz.py")
    r = subprocess.run([sys.executable, script, "1234", "100", "16"], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    counts = json.loads(r.stdout.strip().splitlines()[-1])
    assert counts["accepted_unsupported"] == 0 and counts["unexpected_rejections"] == 0, counts
    assert counts["invalid_json"] == 0, (counts, r.stderr[-3000:])
    assert counts["errors"] > 0 and counts["stop"] > 0, counts  # both kinds of case were generated
