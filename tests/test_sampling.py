"""Host sampling's shortcuts pick what llama.cpp's own samplers pick from the whole row.

fastpar does not hand a whole row of logits to llama.cpp's sampler chain: greedy is an
argmax over blocks, top-k collects the k best from the blocks whose maximum can hold them,
and device sampling leaves only the best blocks, in no particular order
(csrc/core/sampling/sampling.cpp, device_sampling.hpp). `_testing.sample_against_llama` runs a chain
both ways from the same seed; random rows have no ties at the k-th place, where the two may
differ by design (README, device_sampling)."""

import random

import pytest

from fastpar import _core, _testing

TYPICAL = dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.0)
WIDTH = 128  # device sampling's block width for these vocabularies (DeviceSampling::block_for)


def _params(**kw):
    p = _core.GenerateParams()
    for key, value in kw.items():
        setattr(p, key, value)
    return p


def _row(n, rng):
    return [rng.gauss(0.0, 3.0) for _ in range(n)]


def _device_blocks(x, rng, keep=64):
    """What device sampling keeps of row x: the `keep` blocks with the largest maxima, shuffled."""
    maxima = [max(x[i:i + WIDTH]) for i in range(0, len(x), WIDTH)]
    blocks = sorted(range(len(maxima)), key=lambda b: -maxima[b])[:keep]
    rng.shuffle(blocks)
    return blocks


@pytest.mark.parametrize("n", [151936, 49152, 300])
@pytest.mark.parametrize("top_k", [1, 7, 40, 64])
def test_top_k_from_the_whole_row_matches_llama(n, top_k):
    rng = random.Random(n * 100 + top_k)
    p = _params(**dict(TYPICAL, top_k=top_k))
    for seed in range(4):
        ours, theirs = _testing.sample_against_llama(p, seed, _row(n, rng), [], 0, 5)
        assert ours == theirs, (seed, ours, theirs)


@pytest.mark.parametrize("n", [151937, 301])
@pytest.mark.parametrize("n_finite", [10, None])
def test_top_k_with_masked_logits_matches_llama(n, n_finite):
    # -inf logits (a masked vocabulary), a row whose blocks and last block are no multiple
    # of the four logits the scan compares at once, and fewer finite logits than k.
    rng = random.Random(n + (n_finite or 0))
    p = _params(**TYPICAL)
    for seed in range(3):
        x = _row(n, rng)
        keep = set(rng.sample(range(n), n_finite)) if n_finite else set(range(0, n, 2))
        x = [v if i in keep else float("-inf") for i, v in enumerate(x)]
        ours, theirs = _testing.sample_against_llama(p, seed, x, [], 0, 5)
        assert ours == theirs, (seed, ours, theirs)
        assert all(t in keep for t in ours)


@pytest.mark.parametrize("n", [151937, 49153, 301])
def test_top_k_finds_the_best_logits_at_the_row_ends(n):
    # The scan compares four logits at a time: the first and last logits of the row (the
    # last is a tail of a block that is no multiple of four here) must still be found.
    rng = random.Random(n)
    p = _params(**TYPICAL)
    for at in (0, n - 1, n - 2):
        x = _row(n, rng)
        x[at] = max(x) + 50.0  # chosen whatever the draw
        ours, theirs = _testing.sample_against_llama(p, 1, x, [], 0, 3)
        assert ours == theirs == [at] * 3


@pytest.mark.parametrize("n", [151936, 49152])
@pytest.mark.parametrize("top_k", [1, 40, 64])
def test_top_k_from_device_candidates_matches_llama(n, top_k):
    rng = random.Random(n + top_k)
    p = _params(**dict(TYPICAL, top_k=top_k))
    for seed in range(4):
        x = _row(n, rng)
        ours, theirs = _testing.sample_against_llama(p, seed, x, _device_blocks(x, rng), WIDTH, 5)
        assert ours == theirs, (seed, ours, theirs)


@pytest.mark.parametrize("device", [False, True])
def test_greedy_takes_the_lowest_id_among_equal_best_logits(device):
    rng = random.Random(5)
    n = 151936
    p = _params(temperature=0.0)
    for tied in ([9000, 3000, 150000], [40000, 40001], [70000]):
        x = [min(v, 10.0) for v in _row(n, rng)]
        for t in tied:
            x[t] = 12.5
        blocks = _device_blocks(x, rng) if device else []
        ours, theirs = _testing.sample_against_llama(p, 0, x, blocks, WIDTH if device else 0, 2)
        assert ours == theirs == [min(tied)] * 2


def test_greedy_matches_llama_on_random_rows():
    rng = random.Random(9)
    p = _params(temperature=0.0)
    for n in (151936, 49152, 300):
        for _ in range(3):
            x = [round(v) for v in _row(n, rng)]  # whole numbers: ties everywhere, at the top too
            ours, theirs = _testing.sample_against_llama(p, 0, x, [], 0, 1)
            assert ours == theirs
            if n % WIDTH == 0:
                ours, theirs = _testing.sample_against_llama(p, 0, x, _device_blocks(x, rng), WIDTH, 1)
                assert ours == theirs


@pytest.mark.parametrize("workers", [0, 1, 3])
@pytest.mark.parametrize("copies", [1, 3])
def test_rows_split_over_threads_choose_what_llama_chooses(workers, copies):
    # choose_split (fewer than 8 whole rows from a GPU): each row's first pass cut into
    # parts on a pool, its token chosen by the thread that finishes its last part; every
    # copy of the row has its own chain from the same seed.
    rng = random.Random(workers * 10 + copies)
    typical, greedy = _params(**TYPICAL), _params(temperature=0.0)
    split = dict(split_rows=copies, pool_workers=workers)
    for n in (151936, 151937, 65536):
        x = _row(n, rng)
        masked = [v if i % 3 == 0 else float("-inf") for i, v in enumerate(x)]
        whole = [float(round(v)) for v in x]  # ties everywhere, at the top too
        for p, row in ((typical, x), (typical, masked), (greedy, x), (greedy, whole)):
            ours, theirs = _testing.sample_against_llama(p, 3, row, [], 0, 3, **split)
            assert len(ours) == 3 * copies
            assert ours == theirs
        for at in (n - 1, 0):  # the best logit in the last part (its last block's tail), the first
            row = list(x)
            row[at] = max(x) + 50.0
            for p in (typical, greedy):
                ours, theirs = _testing.sample_against_llama(p, 1, row, [], 0, 2, **split)
                assert ours == theirs == [at] * 2 * copies
        tie = list(x)
        tie[n - 1] = tie[5] = max(x) + 50.0  # equal best logits in the first and the last part
        ours, theirs = _testing.sample_against_llama(greedy, 0, tie, [], 0, 1, **split)
        assert ours == theirs == [5] * copies


def test_split_needs_a_row_and_chain_that_split():
    rng = random.Random(1)
    with pytest.raises(ValueError, match="split_rows"):  # a short row: read whole at once
        _testing.sample_against_llama(_params(**TYPICAL), 0, _row(300, rng), [], 0, 1, split_rows=2)
    with pytest.raises(ValueError, match="split_rows"):  # penalties need every candidate
        _testing.sample_against_llama(_params(**TYPICAL, repeat_penalty=1.1), 0, _row(151936, rng), [], 0, 1,
                                    split_rows=2)
