"""Shared fixtures: the real default model, and a cache of each prompt's output alone.

FASTPAR_TEST_N_GPU_LAYERS=-1 runs the whole suite with every layer on the GPU (a CUDA or
Metal build); unset or 0, everything runs on the CPU.
"""

from __future__ import annotations

import os
import signal

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

# A suite started in the background (nohup, `&` in a script) inherits SIGINT ignored, and so
# would every child it starts: the tests that press Ctrl-C in a child (test_interrupts.py,
# `fastpar run` in test_server.py) need it delivered, as in a terminal. A handler, unlike
# SIG_IGN, is not inherited across exec: children start with SIGINT at its default.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

N_GPU_LAYERS = int(os.environ.get("FASTPAR_TEST_N_GPU_LAYERS") or 0)
ON_GPU = N_GPU_LAYERS != 0

# scripts/sanitize.sh names its sanitizer here. Instrumented code runs several times slower,
# so bounds on latency stretch by SLOWDOWN; AddressSanitizer holds freed memory in
# quarantine (up to 256 MiB by default), so resident memory grows by design under it.
SANITIZER = os.environ.get("FASTPAR_TEST_SANITIZER", "")
SLOWDOWN = 5.0 if SANITIZER else 1.0

# On the CPU a prompt's greedy output alone and in any batch is identical, token for token.
# On a GPU it is not: llama.cpp's CUDA kernels pick their algorithm by batch shape (and a
# row's place in it), so a sequence's logits alone and beside others differ, and greedy
# runs part where two tokens are close. Measured on an H100 with the default model
# (SmolLM2-135M Q4_1), "The capital of France is", 12 greedy tokens: alone, and alone in a
# 4-slot context, identical; beside 3 other prompts, already 0.18 apart at the first token
# and up to 0.35 before the runs part at token 5; over the whole suite (60 comparisons) up
# to 0.79 at a parting token. Beside different prompts of the same lengths, though, a
# sequence is bit-identical. So on a GPU the tests ask for logprobs and check what holds: the runs agree until
# they part, every chosen token up to and including the first difference has the same
# log-probability in both within GPU_LOGPROB_TOL, and (test_isolation) a sequence's output
# is bit-identical whoever its batch-mates are, when the batch shapes are the same.
GREEDY = dict(temperature=0.0, logprobs=True) if ON_GPU else dict(temperature=0.0)
GPU_LOGPROB_TOL = 1.0
DIVERGENCE: list = []  # GPU runs: (prompt, first differing index or None, largest |logprob diff|)


@pytest.fixture(scope="session")
def model() -> fastpar.Model:
    return fastpar.Model(fastpar.default_model_path(), n_gpu_layers=N_GPU_LAYERS)


@pytest.fixture(scope="session")
def solo_ctx(model: fastpar.Model) -> fastpar.Context:
    return fastpar.Context(model, n_parallel=1, n_ctx_per_seq=512)


@pytest.fixture(scope="session")
def solo(solo_ctx: fastpar.Context):
    """solo(prompt, max_tokens) -> the Completion of that prompt generated alone (greedy), cached."""
    cache: dict = {}

    def run(prompt: str, max_tokens: int = 48) -> fastpar.Completion:
        key = (prompt, max_tokens)
        if key not in cache:
            (c,) = fastpar.generate_parallel(solo_ctx, [prompt], max_tokens=max_tokens, **GREEDY)
            assert c.finish_reason in ("stop", "length"), c.error
            cache[key] = c
        return cache[key]

    return run


def assert_same_greedy(c: fastpar.Completion, want: fastpar.Completion, what: str) -> None:
    """Two greedy runs of one prompt under different batch shapes: identical on the CPU; on a GPU, see GREEDY."""
    if not ON_GPU:
        assert c.token_ids == want.token_ids, f"greedy outputs differ: {what}"
        return
    n = min(len(c.token_ids), len(want.token_ids))
    k = next((i for i in range(n) if c.token_ids[i] != want.token_ids[i]), n)
    worst = max((abs(c.logprobs[i] - want.logprobs[i]) for i in range(min(k + 1, n))), default=0.0)
    DIVERGENCE.append((what, k if k < n or len(c.token_ids) != len(want.token_ids) else None, worst))
    assert worst <= GPU_LOGPROB_TOL, (
        f"{what}: log-probabilities differ by {worst:.4f} (tolerance {GPU_LOGPROB_TOL}) up to token {k}")


def assert_as_solo(results, prompts, solo, max_tokens: int = 48) -> None:
    """Each result is what its prompt gives alone."""
    assert len(results) == len(prompts)
    for c, prompt in zip(results, prompts):
        assert_same_greedy(c, solo(prompt, max_tokens), f"{prompt!r} in a batch and alone")


def pytest_terminal_summary(terminalreporter):
    if DIVERGENCE:
        parted = [d for d in DIVERGENCE if d[1] is not None]
        terminalreporter.write_line(
            f"GPU isolation: {len(parted)} of {len(DIVERGENCE)} batched greedy outputs parted from their solo run "
            f"(first differing tokens at {sorted(d[1] for d in parted)}); largest logprob difference up to the "
            f"parting point {max(d[2] for d in DIVERGENCE):.5f} (tolerance {GPU_LOGPROB_TOL})")


def assert_clean(ctx) -> None:
    """The cleanup contract, for a Context between calls or an Engine between steps: a slot
    holds nothing but what the prefix cache keeps (a prompt that ended normally, from
    position 0: its KV is as long as the cache says); every other slot is empty."""
    kv = ctx.kv_seq_pos_max()
    held = ctx.prefix_cache_stats()
    assert sum(1 for p in kv if p >= 0) == held.n_slots_held, (kv, held)
    assert sum(p + 1 for p in kv) == held.n_tokens_held, (kv, held)


def assert_empty(ctx) -> None:
    """No slot holds a KV position (the prefix cache off or cleared, or every request cancelled)."""
    assert ctx.kv_seq_pos_max() == [-1] * ctx.n_parallel
