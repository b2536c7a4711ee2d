#!/usr/bin/env python3
"""The two candidate grammar engines for structured output, on one schema and vocabulary.

llama.cpp's grammar sampler (as fastpar uses it: fastpar._testing.measure_grammar) and
xgrammar's matcher, both on the 5-field extraction schema of bench_structured.py and the
default model's vocabulary, walking the same tokens of one valid answer: the time to
compile the schema, to mask the whole vocabulary at a position, and to check or accept one
token. xgrammar is not a dependency of fastpar; its wheel declares torch and transformers,
which this measurement does not use: install it alone with
`pip install --no-deps xgrammar apache-tvm-ffi pydantic numpy`.

    python bench/bench_grammar_engines.py
"""

from __future__ import annotations

import json
import time

import numpy as np
from gguf import GGUFReader

import fastpar
from fastpar import _core, _testing

from bench_structured import SCHEMA

def stub_torch() -> None:
    """xgrammar's Python package imports torch, transformers and triton at import time for
    its tensor helpers and tokenizer loaders; its matcher fills a numpy bitmask without
    them. Empty stand-ins let it import where they are not installed."""
    import sys
    import types

    class Nothing:  # a function or namespace that returns nothing
        def __call__(self, *args, **kwargs):
            return None

        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return Nothing()

    class Stub(types.ModuleType):
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            value = type(name, (), {}) if name[:1].isupper() else Nothing()
            setattr(self, name, value)
            return value

    for name in ["torch", "torch.cuda", "torch.nn", "torch.nn.functional", "torch.utils", "torch.utils.dlpack",
                 "transformers", "tiktoken", "sentencepiece", "triton", "triton.language"]:
        try:
            __import__(name)
        except ImportError:
            sys.modules[name] = Stub(name)
            parent, _, child = name.rpartition(".")
            if parent:
                setattr(sys.modules[parent], child, sys.modules[name])


ANSWER = '{"category": "bug", "priority": 2, "summary": "app crashes on save", "urgent": true, "tags": ["crash", "save"]}'


def main() -> None:
    path = fastpar.default_model_path()
    model = fastpar.Model(path)
    tokens = model._model.tokenize(ANSWER)
    p = _core.GenerateParams()
    p.json_schema = json.dumps(SCHEMA)
    runs = [_testing.measure_grammar(model._model, p, tokens) for _ in range(3)]
    llama = {k: min(r[k] for r in runs) for k in runs[0]}
    print("llama.cpp grammar:", json.dumps({k: round(v, 4) for k, v in llama.items()}))

    stub_torch()
    import xgrammar as xgr

    reader = GGUFReader(path)
    field = reader.fields["tokenizer.ggml.tokens"]
    vocab = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
    eos = int(reader.fields["tokenizer.ggml.eos_token_id"].parts[-1][0])
    info = xgr.TokenizerInfo(vocab, vocab_type=xgr.VocabType.BYTE_LEVEL, vocab_size=len(vocab), stop_token_ids=[eos])
    t0 = time.perf_counter()
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    t_tokenizer = time.perf_counter() - t0
    t0 = time.perf_counter()
    compiled = compiler.compile_json_schema(json.dumps(SCHEMA))
    t_compile = time.perf_counter() - t0
    best_mask, best_accept = float("inf"), float("inf")
    for _ in range(3):
        matcher = xgr.GrammarMatcher(compiled)
        bitmask = np.zeros((1, (len(vocab) + 31) // 32), dtype=np.int32)
        t_mask = t_accept = 0.0
        for tok in tokens:
            t0 = time.perf_counter()
            matcher.fill_next_token_bitmask(bitmask)
            t_mask += time.perf_counter() - t0
            t0 = time.perf_counter()
            ok = matcher.accept_token(tok)
            t_accept += time.perf_counter() - t0
            assert ok, tok
        best_mask = min(best_mask, t_mask / len(tokens))
        best_accept = min(best_accept, t_accept / len(tokens))
    print("xgrammar:", json.dumps({"compiler_setup_ms": round(1e3 * t_tokenizer, 3), "compile_ms": round(1e3 * t_compile, 3),
                                   "mask_ms": round(1e3 * best_mask, 4), "accept_ms": round(1e3 * best_accept, 4)}))


if __name__ == "__main__":
    main()
