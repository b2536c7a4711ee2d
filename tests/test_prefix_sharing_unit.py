"""Prefix sharing's decisions alone (csrc/core/loop/prefix_sharing.hpp), without a model or a
KV cache: which slot copies its prefix from which, who waits for a slot ahead of it, and
the minimum length worth sharing. tests/test_prefix_sharing.py tests it with a model."""

from fastpar import _testing as T

MIN = 4


def sharing(prompts, min_shared=MIN):
    ps = T.PrefixSharing(len(prompts), min_shared)
    for a in range(len(prompts)):
        for b in range(a + 1, len(prompts)):
            if prompts[a] is not None and prompts[b] is not None:
                ps.pair_up(a, prompts[a], b, prompts[b])
    return ps


def slots(prompts, n_fed):
    return [T.SharingView(active=p is not None, n_fed=f, prompt_size=len(p or [])) for p, f in zip(prompts, n_fed)]


def test_common_prefix_is_recorded_both_ways():
    ps = sharing([[1, 2, 3, 4, 5], [1, 2, 3, 9], [7]])
    assert ps.common(0, 1) == ps.common(1, 0) == 3
    assert ps.common(0, 2) == 0


def test_common_prefix_across_and_within_blocks():
    # common_prefix compares 64-token blocks first, then token by token: a difference at
    # every place around the block edges, and one prompt ending where the other goes on.
    base = list(range(1000, 1300))
    for at in (0, 1, 63, 64, 65, 127, 128, 129, 200, 299):
        other = base[:at] + [-1] + base[at + 1:]
        assert sharing([base, other]).common(0, 1) == at, at
        assert sharing([base, base[:at]]).common(0, 1) == at, at
    assert sharing([base, list(base)]).common(0, 1) == len(base)


def test_a_prefilling_slot_copies_from_the_donor_that_holds_the_most():
    base = list(range(100, 120))
    prompts = [base + [1, 2], base[:10] + [5] * 12, base + [3, 4, 5], base + [9]]
    # Slot 0 decoded all 22 prompt tokens, slot 1 its 22 (only 10 shared), slot 2 nothing,
    # slot 3 nothing yet either.
    out = sharing(prompts).decide(slots(prompts, [22, 22, 0, 0]))
    assert out[2].copied and out[2].donor == 0 and out[2].n_fed == 20
    assert out[3].copied and out[3].donor == 0 and out[3].n_fed == 20
    assert not out[0].copied and not out[1].copied
    assert not any(s.waiting for s in out)


def test_the_last_prompt_token_is_always_decoded_by_the_slot_itself():
    p = list(range(30))
    out = sharing([p, list(p)]).decide(slots([p, list(p)], [30, 0]))
    assert out[1].copied and out[1].n_fed == 29  # its logits start its generation


def test_a_slot_waits_for_one_ahead_that_is_still_decoding_the_prefix():
    base = list(range(50))
    prompts = [base + [1], base + [2]]
    # Slot 0 has decoded 8 of the 50 common tokens, slot 1 none: slot 1 waits for slot 0.
    out = sharing(prompts).decide(slots(prompts, [8, 0]))
    assert out[1].waiting and not out[1].copied
    assert not out[0].waiting  # the slot furthest ahead always goes on
    # Both at 0: the lower seq_id is ahead; only slot 1 waits.
    out = sharing(prompts).decide(slots(prompts, [0, 0]))
    assert not out[0].waiting and out[1].waiting


def test_a_copy_now_beats_waiting_for_little_more():
    base = list(range(40))
    prompts = [base + [1], base + [2], base[:38] + [3] * 3]
    # Slot 2 holds 38 tokens slot 1 shares; slot 0, ahead and still decoding, will hold 40:
    # 40 < 38 + MIN is not worth the wait, so slot 1 copies 38 from slot 2 now.
    out = sharing(prompts).decide(slots(prompts, [33, 0, 41]))
    assert out[1].copied and out[1].donor == 2 and out[1].n_fed == 38 and not out[1].waiting
    # Holding only 30 in common with slot 2, it waits for slot 0's 40 (>= 30 + MIN).
    prompts[2] = base[:30] + [3] * 11
    out = sharing(prompts).decide(slots(prompts, [33, 0, 41]))
    assert out[1].waiting and not out[1].copied


def test_shorter_prefixes_than_min_shared_are_not_shared():
    prompts = [[1, 2, 3, 9, 9, 9], [1, 2, 3, 8, 8, 8]]
    out = sharing(prompts, min_shared=4).decide(slots(prompts, [6, 0]))
    assert not out[1].copied and not out[1].waiting
    out = sharing(prompts, min_shared=3).decide(slots(prompts, [6, 0]))
    assert out[1].copied and out[1].n_fed == 3
    # A gain smaller than min_shared over what the slot already holds is no copy either.
    prompts = [list(range(20)) + [1], list(range(20)) + [2]]
    out = sharing(prompts).decide(slots(prompts, [21, 17]))
    assert not out[1].copied
    out = sharing(prompts).decide(slots(prompts, [21, 16]))
    assert out[1].copied and out[1].n_fed == 20


def test_a_slot_that_copies_is_no_donor_in_the_same_step_and_inactive_slots_are_ignored():
    base = list(range(30))
    prompts = [base + [1], base + [2], base + [3], None]
    out = sharing(prompts).decide(slots(prompts, [31, 0, 0, 0]))
    assert [s.donor for s in out[1:3]] == [0, 0]
    assert not out[3].copied and not out[3].waiting
    # With slot 0 gone, nobody holds the prefix: slot 2 waits for slot 1 (ahead by seq_id).
    prompts = [None, base + [2], base + [3]]
    out = sharing(prompts).decide(slots(prompts, [0, 0, 0]))
    assert not out[1].waiting and out[2].waiting


def test_default_min_shared_is_the_products():
    assert T.PrefixSharing(2).decide(slots([[1] * 10, [1] * 10], [10, 0]))[1].copied is (9 >= T.MIN_SHARED_PREFIX)
