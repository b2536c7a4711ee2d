"""Random JSON schemas and GBNF grammars, from a seeded generator, for structured output.

Run as a script it generates with every one of them in one Engine (its own process, so
that the caller sees a crash as an exit status) and prints one JSON line of counts:
tests/test_structured_output.py runs 100, bench/bench_structured.py --fuzz more.
"""

from __future__ import annotations

import json
import random
import sys
from typing import Any, Dict, List, Tuple

WORDS = ["alpha", "beta", "gamma", "red", "blue", "yes", "no", "cat", "dog", "x y", "é", "日本"]


def random_schema(rng: random.Random, depth: int = 0) -> Dict[str, Any]:
    kinds = ["string", "integer", "number", "boolean", "null", "enum", "const"]
    if depth < 3:
        kinds += ["object", "object", "array", "anyOf"]
    kind = rng.choice(kinds)
    if kind == "string":
        s: Dict[str, Any] = {"type": "string"}
        r = rng.random()
        if r < 0.3:
            lo = rng.randint(0, 4)
            s.update(minLength=lo, maxLength=lo + rng.randint(0, 8))
        elif r < 0.5:
            s["pattern"] = rng.choice(["^[a-z]{1,6}$", "^[0-9]{3}-[0-9]{2}$", "^(ab|cd)+$", "^[A-Z][a-z]*$"])
        elif r < 0.6:
            s["format"] = rng.choice(["date", "time", "date-time", "uuid"])
        return s
    if kind in ("integer", "number"):
        s = {"type": kind}
        if rng.random() < 0.6:
            lo = rng.randint(-50, 50)
            s.update(minimum=lo, maximum=lo + rng.randint(0, 200))
        return s
    if kind in ("boolean", "null"):
        return {"type": kind}
    if kind == "enum":
        return {"enum": rng.sample(WORDS, rng.randint(1, 4)) + ([1, None] if rng.random() < 0.2 else [])}
    if kind == "const":
        return {"const": rng.choice(WORDS + [3, True])}
    if kind == "object":
        names = rng.sample(["a", "b", "name", "value", "id", "tags", "ok"], rng.randint(1, 4))
        props = {n: random_schema(rng, depth + 1) for n in names}
        s = {"type": "object", "properties": props,
             "required": [n for n in names if rng.random() < 0.7]}
        if rng.random() < 0.5:
            s["additionalProperties"] = False
        return s
    if kind == "array":
        s = {"type": "array", "items": random_schema(rng, depth + 1)}
        if rng.random() < 0.6:
            lo = rng.randint(0, 2)
            s.update(minItems=lo, maxItems=lo + rng.randint(0, 3))
        return s
    return {"anyOf": [random_schema(rng, depth + 1) for _ in range(rng.randint(1, 3))]}


UNSUPPORTED = [{"not": {"type": "string"}}, {"type": "string", "format": "email"},
               {"type": "integer", "multipleOf": 3}, {"oneOf": [{"type": "string"}]},
               {"type": "array", "uniqueItems": True}, {"type": "string", "pattern": "[a-z]+"}]


def random_grammar(rng: random.Random) -> str:
    """GBNF of a few rules; some do not parse, some can reach a dead end."""
    n_rules = rng.randint(1, 4)
    names = ["root"] + [f"r{i}" for i in range(1, n_rules)]

    def item(i: int) -> str:
        r = rng.random()
        if r < 0.35:
            return json.dumps(rng.choice(WORDS), ensure_ascii=False)
        if r < 0.55:
            return rng.choice(["[a-z]", "[0-9]", "[^\\n]", "[ \\t]", "[A-Z0-9_]", "[^\\x00-\\U0010FFFF]"])
        if r < 0.7 and i + 1 < n_rules:
            return names[rng.randint(i + 1, n_rules - 1)]
        if r < 0.85:
            return "(" + " | ".join(json.dumps(w, ensure_ascii=False) for w in rng.sample(WORDS, 2)) + ")"
        return json.dumps(rng.choice(WORDS), ensure_ascii=False) + rng.choice(["*", "+", "?", "{1,3}", "{2}"])

    rules = []
    for i, name in enumerate(names):
        alts = [" ".join(item(i) for _ in range(rng.randint(1, 3))) for _ in range(rng.randint(1, 2))]
        rules.append(f"{name} ::= " + " | ".join(alts))
    text = "\n".join(rules)
    r = rng.random()
    if r < 0.08:
        text = text.replace("::=", "::", 1)             # does not parse
    elif r < 0.14:
        text += "\nroot2 ::= undefined-rule"            # an undefined rule
    elif r < 0.18:
        text = "root ::= root \"a\" | \"b\""            # left recursion
    elif r < 0.22:
        text = text + " ("                              # unbalanced
    return text


def cases(seed: int, count: int) -> List[Tuple[str, str]]:
    """`count` (kind, text) pairs: kind is "schema", "unsupported" or "grammar"."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        r = rng.random()
        if r < 0.45:
            out.append(("schema", json.dumps(random_schema(rng), ensure_ascii=False)))
        elif r < 0.5:
            out.append(("unsupported", json.dumps(rng.choice(UNSUPPORTED))))
        else:
            out.append(("grammar", random_grammar(rng)))
    return out


def run(seed: int, count: int, max_tokens: int) -> Dict[str, int]:
    import jsonschema

    import fastpar
    from fastpar import _core

    counts = {"cases": count, "rejected": 0, "unexpected_rejections": 0, "accepted_unsupported": 0,
              "errors": 0, "stop": 0, "length": 0, "invalid_json": 0}
    model = fastpar.Model(fastpar.default_model_path())
    requests = []
    with fastpar.Engine(model, n_parallel=16, n_ctx_per_seq=256) as engine:
        for kind, text in cases(seed, count):
            p = _core.GenerateParams()
            p.max_tokens = max_tokens
            p.temperature = 0.7
            p.seed = 1
            if kind == "grammar":
                p.grammar = text
            else:
                p.json_schema = text
            try:
                handle = engine._engine.submit("Answer in the format asked for:", p, 0.0)
            except ValueError:
                counts["rejected"] += 1
                if kind != "unsupported":
                    counts["unexpected_rejections"] += 1
                continue
            if kind == "unsupported":
                counts["accepted_unsupported"] += 1
            requests.append((kind, text, handle))
        for kind, text, handle in requests:
            (c,) = handle.result(None)  # the core's handle: one completion a sample
            if c.finish_reason == "error":
                counts["errors"] += 1
            elif c.finish_reason == "stop":
                counts["stop"] += 1
                if kind == "schema":
                    try:
                        jsonschema.validate(json.loads(c.text), json.loads(text))
                    except (ValueError, jsonschema.ValidationError):
                        counts["invalid_json"] += 1
                        print("invalid:", text, repr(c.text), file=sys.stderr)
            else:
                counts["length"] += 1
    return counts


if __name__ == "__main__":
    seed, count, max_tokens = (int(a) for a in sys.argv[1:4])
    print(json.dumps(run(seed, count, max_tokens)))
