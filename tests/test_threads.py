"""Threads: the GIL is released while generating; calls on one Context take turns;
two Contexts of one Model run side by side."""

from __future__ import annotations

import threading
import time

import fastpar
import pytest
from conftest import GREEDY, PROMPTS, assert_as_solo, assert_clean


def test_gil_released_other_thread_progresses(model):
    ctx = fastpar.Context(model, n_parallel=4, n_ctx_per_seq=256)
    ticks = 0
    done = threading.Event()

    def spin():
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            time.sleep(0.001)

    # Baseline: ticks in the same wall time with the main thread merely sleeping.
    t = threading.Thread(target=spin)
    t.start()
    start = time.perf_counter()
    while time.perf_counter() - start < 0.3:  # a GPU finishes one call in less
        fastpar.generate_parallel(ctx, PROMPTS[:4], max_tokens=48, ignore_eos=True, **GREEDY)
    elapsed = time.perf_counter() - start
    done.set()
    t.join()
    # With the GIL held for the whole call the spinner would get (almost) no turns;
    # a free GIL lets it tick about once per millisecond.
    assert elapsed > 0.2
    # (Held, it would get a turn only at the 50 ms signal polls: about 0.02 per ms.)
    assert ticks > 0.1 * elapsed * 1000, (ticks, elapsed)


def _generate_in_two_threads(ctxs, solo):
    """Thread i runs prompts 4i..4i+3 on ctxs[i]; each result must equal its solo run."""
    out: dict = {}

    def run(i):
        out[i] = fastpar.generate_parallel(ctxs[i], PROMPTS[4 * i: 4 * i + 4], max_tokens=48, **GREEDY)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(2):
        assert_as_solo(out[i], PROMPTS[4 * i: 4 * i + 4], solo)
        assert_clean(ctxs[i])


def test_two_threads_on_one_context_take_turns(model, solo):
    ctx = fastpar.Context(model, n_parallel=4, n_ctx_per_seq=256)
    _generate_in_two_threads([ctx, ctx], solo)


def test_two_contexts_of_one_model_run_in_parallel(model, solo):
    ctxs = [fastpar.Context(model, n_parallel=4, n_ctx_per_seq=256, n_threads=1) for _ in range(2)]
    _generate_in_two_threads(ctxs, solo)


@pytest.mark.parametrize("n_workers", [0, 1, 3, 15])
@pytest.mark.parametrize("caller_spin_us, anticipate_us", [(0, 0), (200, 0), (100, 20)])
def test_sampling_pool_runs_every_item_once_and_rethrows(n_workers, caller_spin_us, anticipate_us):
    # The pool that samples and tokenizes many sequences at once (csrc/core/pool.hpp):
    # 5,000 runs of 0-39 items, every seventh with an item that throws; run() returns only
    # when every item has run exactly once, and rethrows that exception. Also with the
    # caller polling before it sleeps, and with the options a Context on a GPU uses
    # (workers waking ahead of the next run and polling; the runs then come 0-2
    # anticipate_us apart, so that some come before the workers wake, some while they
    # poll, some after).
    from fastpar import _testing

    assert _testing.stress_task_pool(n_workers, 5000, caller_spin_us, anticipate_us) == 0
