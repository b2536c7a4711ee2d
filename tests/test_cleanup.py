"""Cleanup: after every call, however it ended, the context holds nothing of it."""

from __future__ import annotations

import signal

import pytest

import fastpar
from conftest import GREEDY, PROMPTS, assert_clean


def test_cleanup_after_success_and_repeat_is_identical(model):
    ctx = fastpar.Context(model, n_parallel=4, n_ctx_per_seq=256)
    first = fastpar.generate_parallel(ctx, PROMPTS, max_tokens=24, **GREEDY)
    assert_clean(ctx)
    second = fastpar.generate_parallel(ctx, PROMPTS, max_tokens=24, **GREEDY)
    assert_clean(ctx)
    assert [c.token_ids for c in first] == [c.token_ids for c in second]


def test_cleanup_after_per_prompt_error(model):
    ctx = fastpar.Context(model, n_parallel=4, n_ctx_per_seq=128)
    results = fastpar.generate_parallel(ctx, ["word " * 300, PROMPTS[0], "", PROMPTS[1]], max_tokens=16, **GREEDY)
    assert [c.finish_reason for c in results][0] == "error"
    assert results[2].finish_reason == "error"
    assert_clean(ctx)
    fresh = fastpar.Context(model, n_parallel=4, n_ctx_per_seq=128)
    again = fastpar.generate_parallel(ctx, PROMPTS[:4], max_tokens=16, **GREEDY)
    expected = fastpar.generate_parallel(fresh, PROMPTS[:4], max_tokens=16, **GREEDY)
    assert [c.token_ids for c in again] == [c.token_ids for c in expected]


def _raise_keyboard_interrupt(signum, frame):
    raise KeyboardInterrupt


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs signal.setitimer")
def test_cleanup_after_keyboard_interrupt(model):
    ctx = fastpar.Context(model, n_parallel=4, n_ctx_per_seq=512)
    # A real signal from a kernel timer, as Ctrl-C is one: its Python handler raises
    # KeyboardInterrupt when fastpar polls for signals (every 50 ms) on the calling thread.
    # (A threading.Timer calling _thread.interrupt_main once let a call run to its end on a
    # loaded machine: that needs the timer's thread to be scheduled and to take the GIL.)
    previous = signal.signal(signal.SIGALRM, _raise_keyboard_interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    try:
        with pytest.raises(KeyboardInterrupt):
            # Long enough (thousands of tokens) that the interrupt lands mid-generation.
            fastpar.generate_parallel(ctx, PROMPTS * 4, max_tokens=400, ignore_eos=True, **GREEDY)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert_clean(ctx)
    stats = ctx.last_stats
    assert 0 < stats.n_gen_tokens < 32 * 400  # it stopped part-way
    fresh = fastpar.Context(model, n_parallel=4, n_ctx_per_seq=512)
    again = fastpar.generate_parallel(ctx, PROMPTS[:4], max_tokens=16, **GREEDY)
    expected = fastpar.generate_parallel(fresh, PROMPTS[:4], max_tokens=16, **GREEDY)
    assert [c.token_ids for c in again] == [c.token_ids for c in expected]
