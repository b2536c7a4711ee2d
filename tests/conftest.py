"""Shared fixtures: the real default model, and a cache of each prompt's output alone."""

from __future__ import annotations

import pytest

import fastpar

# Eight different prompts, short enough to keep the suite fast on two cores.
PROMPTS = [
    "The capital of France is",
    "Here is a short poem about the sea:\n",
    "def fibonacci(n):\n",
    "The three primary colors are",
    "Once upon a time, in a small village,",
    "The best way to learn a language is",
    "Water boils at",
    "My favourite recipe for pancakes:",
]

MORE_PROMPTS = PROMPTS + [
    "The largest planet in the solar system is",
    "A good name for a cat is",
    "In 1969, humans",
    "The recipe calls for two cups of",
    "To be or not to be,",
    "The quick brown fox",
    "Photosynthesis is the process by which",
    "import numpy as np\n",
    "Dear Sir or Madam,",
    "The meaning of life is",
    "Rain is caused by",
    "Monday morning meetings are",
]

GREEDY = dict(temperature=0.0)


@pytest.fixture(scope="session")
def model() -> fastpar.Model:
    return fastpar.Model(fastpar.default_model_path())


@pytest.fixture(scope="session")
def solo_ctx(model: fastpar.Model) -> fastpar.Context:
    return fastpar.Context(model, n_parallel=1, n_ctx_per_seq=512)


@pytest.fixture(scope="session")
def solo(solo_ctx: fastpar.Context):
    """solo(prompt, max_tokens) -> token ids of that prompt generated alone (greedy), cached."""
    cache: dict = {}

    def run(prompt: str, max_tokens: int = 48) -> list:
        key = (prompt, max_tokens)
        if key not in cache:
            (c,) = fastpar.generate_parallel(solo_ctx, [prompt], max_tokens=max_tokens, **GREEDY)
            assert c.finish_reason in ("stop", "length"), c.error
            cache[key] = c.token_ids
        return cache[key]

    return run


def assert_clean(ctx: fastpar.Context) -> None:
    """The cleanup contract: no slot holds a KV position between calls."""
    assert ctx.kv_seq_pos_max() == [-1] * ctx.n_parallel
