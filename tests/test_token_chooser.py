"""How a step chooses its tokens (csrc/core/sampling/token_chooser.hpp): on the calling thread, on
the sampling pool, or with whole rows split over it, by the number of rows and their work."""

import pytest

from fastpar import _core
from fastpar import _testing as T


def params(**kw):
    p = _core.GenerateParams()
    for key, value in kw.items():
        setattr(p, key, value)
    return p


GREEDY = params(temperature=0.0)
TYPICAL = params(temperature=0.8, top_k=40, top_p=0.95, min_p=0.0)


def test_work_counts_a_greedy_logit_once_and_a_sampled_one_four_times():
    assert T.choose_work(GREEDY, 49152) == 49152
    assert T.choose_work(TYPICAL, 49152) == 4 * 49152


def test_many_rows_with_enough_work_go_to_the_pool():
    n = T.MIN_POOLED
    # Eight rows of device candidates (8,192 logits each): greedy stays on one thread,
    # a typical sampler is pooled.
    assert T.choose_way(n, n * T.choose_work(GREEDY, 8192), True, False, False) == "one_thread"
    assert T.choose_way(n, n * T.choose_work(TYPICAL, 8192), True, False, False) == "pooled"
    # Whole rows are always pooled from MIN_POOLED on, on a GPU too.
    assert T.choose_way(n, n * T.choose_work(GREEDY, 49152), True, True, True) == "pooled"
    assert T.choose_way(n - 1, 10**9, True, False, False) == "one_thread"
    # No pool: one thread, whatever the work.
    assert T.choose_way(256, 10**9, False, False, False) == "one_thread"


@pytest.mark.parametrize("n_rows", range(1, 12))
def test_few_whole_rows_from_a_gpu_are_split(n_rows):
    way = T.choose_way(n_rows, n_rows * 151936, True, True, True)
    if n_rows >= T.MIN_POOLED:
        assert way == "pooled"
    elif n_rows >= T.MIN_SPLIT:
        assert way == "split"
    else:
        assert way == "one_thread"  # one row stays on the calling thread
    # Not with the CPU policy, nor when a row does not split.
    if n_rows < T.MIN_POOLED:
        assert T.choose_way(n_rows, n_rows * 151936, True, False, True) == "one_thread"
        assert T.choose_way(n_rows, n_rows * 151936, True, True, False) == "one_thread"


def test_which_rows_split():
    assert T.rows_split(GREEDY, 151936)
    assert T.rows_split(TYPICAL, 151936)
    assert not T.rows_split(TYPICAL, 151936, device_blocks=True)  # candidates are few already
    assert not T.rows_split(params(temperature=0.8, top_k=0), 151936)  # no top-k first pass
    assert not T.rows_split(params(temperature=0.0, repeat_penalty=1.1), 151936)  # penalties need every logit
    assert not T.rows_split(GREEDY, 300)  # a small vocabulary is one pass anyway
