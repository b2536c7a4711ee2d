"""Threads: the GIL is released while generating; calls on one Context take turns;
two Contexts of one Model run side by side."""

from __future__ import annotations

import threading
import time

import fastpar
import pytest
from conftest import GREEDY, PROMPTS, assert_as_solo, assert_clean


def _ticks_while(action):
    """(ticks, seconds): how often a thread that sleeps 1 ms a turn got a turn while the
    calling thread ran ``action``."""
    ticks = 0
    done = threading.Event()

    def spin():
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            time.sleep(0.001)

    t = threading.Thread(target=spin)
    t.start()
    start = time.perf_counter()
    action()
    elapsed = time.perf_counter() - start
    done.set()
    t.join()
    return ticks, elapsed


def test_gil_released_other_thread_progresses(model):
    ctx = fastpar.Context(model, n_parallel=4, n_ctx_per_seq=256)

    def generate_for_a_while():
        start = time.perf_counter()
        while time.perf_counter() - start < 0.3:  # a GPU finishes one call in less
            fastpar.generate_parallel(ctx, PROMPTS[:4], max_tokens=48, ignore_eos=True, **GREEDY)

    # The measure can tell: one C call that holds the GIL throughout (sum over a range
    # never lets it go) leaves the ticking thread (almost) no turns.
    held, held_s = _ticks_while(lambda: sum(range(30_000_000)))
    assert held < 0.1 * held_s * 1000, (held, held_s)
    # A free GIL lets it tick about once per millisecond.
    ticks, elapsed = _ticks_while(generate_for_a_while)
    assert ticks > 0.1 * elapsed * 1000, (ticks, elapsed)


def _generate_in_two_threads(ctxs, solo):
    """Thread i runs prompts 4i..4i+3 on ctxs[i] (2 slots, so they finish in two waves);
    each result must equal its solo run. Returns when each thread's prompts finished."""
    out: dict = {}
    finished: dict = {0: [], 1: []}

    def run(i):
        out[i] = fastpar.generate_parallel(ctxs[i], PROMPTS[4 * i: 4 * i + 4], max_tokens=48,
                                           on_completion=lambda j, c: finished[i].append(time.perf_counter()),
                                           **GREEDY)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(2):
        assert_as_solo(out[i], PROMPTS[4 * i: 4 * i + 4], solo)
        assert_clean(ctxs[i])
    return finished


def _interleaved(finished) -> bool:
    """Whether one thread's prompts finished while the other's call was between two of its own."""
    a, b = finished[0], finished[1]
    return not (max(a) < min(b) or max(b) < min(a))


def test_two_threads_on_one_context_take_turns(model, solo):
    ctx = fastpar.Context(model, n_parallel=2, n_ctx_per_seq=256)
    finished = _generate_in_two_threads([ctx, ctx], solo)
    assert not _interleaved(finished), finished  # one call ran whole, then the other


def test_two_contexts_of_one_model_run_in_parallel(model, solo):
    ctxs = [fastpar.Context(model, n_parallel=2, n_ctx_per_seq=256, n_threads=1) for _ in range(2)]
    finished = _generate_in_two_threads(ctxs, solo)
    assert _interleaved(finished), finished  # both calls were under way at once


@pytest.mark.parametrize("n_workers", [0, 1, 3, 15])
@pytest.mark.parametrize("caller_spin_us, anticipate_us", [(0, 0), (200, 0), (100, 20)])
def test_sampling_pool_runs_every_item_once_and_rethrows(n_workers, caller_spin_us, anticipate_us):
    # The pool that samples and tokenizes many sequences at once (csrc/core/threads/pool.hpp):
    # 5,000 runs of 0-39 items, every seventh with an item that throws; run() returns only
    # when every item has run exactly once, and rethrows that exception. Also with the
    # caller polling before it sleeps, and with the options a Context on a GPU uses
    # (workers waking ahead of the next run and polling; the runs then come 0-2
    # anticipate_us apart, so that some come before the workers wake, some while they
    # poll, some after).
    from fastpar import _testing

    assert _testing.stress_task_pool(n_workers, 5000, caller_spin_us, anticipate_us) == 0
