"""With the default n_threads, llama.cpp's thread count gives way to other work holding the
CPUs (core/threads/thread_governor.hpp); a count the user chose is kept."""

from __future__ import annotations

import glob
import os
import subprocess
import sys

import pytest

import fastpar
import fastpar._testing as T
from conftest import ON_GPU

decide = T.thread_governor_decide


def test_rule_lowers_to_the_share_the_threads_got():
    assert decide(2, 2, 0.5, 0.0) == 1
    assert decide(16, 16, 0.5, 0.0) == 8
    assert decide(16, 16, 0.95, 0.0) == 1
    assert decide(4, 4, 0.25, 0.0) == 3       # never keeps the count it is lowering
    assert decide(1, 4, 0.9, 0.0) == 1


def test_rule_keeps_the_count_when_little_waits_and_probes_up_later():
    assert decide(2, 2, 0.0, 10.0) == 2       # never above the maximum
    assert decide(2, 2, 0.19, 0.0) == 2
    assert decide(1, 2, 0.0, 1.0) == 1        # too soon after a change
    assert decide(1, 2, 0.0, 2.5) == 2
    assert decide(1, 2, 0.15, 2.5) == 1       # still some waiting: no probe


HAS_SCHEDSTAT = bool(glob.glob(f"/proc/{os.getpid()}/task/*/schedstat"))


@pytest.mark.skipif(not HAS_SCHEDSTAT or T.available_cpus() < 2,
                    reason="needs Linux schedstat and at least 2 CPUs")
def test_default_threads_give_way_to_busy_processes_and_a_chosen_count_stays(model):
    n = T.available_cpus()
    prompts = [f"Count slowly from {i} to one hundred:" for i in range(8)]
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2 * n)]
    try:
        adaptive = fastpar.Context(model, n_parallel=8, n_ctx_per_seq=256)
        fixed = fastpar.Context(model, n_parallel=8, n_ctx_per_seq=256, n_threads=n)
        assert adaptive.n_threads == fixed.n_threads == n
        fastpar.generate_parallel(adaptive, prompts, max_tokens=64, temperature=0.0, ignore_eos=True)
        fastpar.generate_parallel(fixed, prompts, max_tokens=64, temperature=0.0, ignore_eos=True)
    finally:
        for p in busy:
            p.kill()
            p.wait()
    if not ON_GPU:
        # With every layer on a GPU llama.cpp's CPU threads hardly compute, so waiting for a
        # core is no share of their time and nothing is lowered (an H200: 16 of 16): there
        # only the chosen count is checked.
        assert adaptive.last_stats.n_threads_low < n, adaptive.last_stats
    assert fixed.last_stats.n_threads_low == n, fixed.last_stats
