"""The step planner alone (csrc/core/loop/step_plan.hpp), without a model: which slots add which
tokens to a step's batch under the CPU policy and the GPU one (padding of gaps between
decoding slots, prompts first), the prompt chunk rules, fairness and the batch budget."""

import random

import pytest

from fastpar import _testing as T


def decoding():
    return T.PlanInput(active=True)


def prompt(left, waiting=False, order=0, priority=0, room=2**32):
    return T.PlanInput(active=True, prefilling=True, waiting=waiting, left=left, order=order, priority=priority,
                       room=room)


def idle():
    return T.PlanInput()


def gpu_policy(**overrides):
    p = T.resolve_step_policy(output_on_gpu=True, kv_unified=False, memory_copies_by_position=True,
                              share_prefixes=False, n_parallel=64, n_threads=16)
    for key, value in overrides.items():
        setattr(p, key, value)
    return p


def cpu_policy():
    return T.resolve_step_policy(output_on_gpu=False, kv_unified=False, memory_copies_by_position=True,
                                 share_prefixes=False, n_parallel=64, n_threads=16)


def test_policy_resolution_differs_between_cpu_and_gpu():
    cpu, gpu = cpu_policy(), gpu_policy()
    assert (cpu.max_padded_gap, cpu.prompts_first, cpu.split_rows, cpu.last_prompt_token_alone) == (0, False, False, False)
    assert (gpu.max_padded_gap, gpu.prompts_first, gpu.split_rows, gpu.last_prompt_token_alone) == \
        (T.MAX_PADDED_GAP_GPU, True, True, True)
    assert cpu.pool_anticipate_us == 0 and gpu.pool_anticipate_us > 0
    # Whole grammar masks on the host's otherwise idle cores, with the output on a GPU only.
    assert (cpu.mask_workers, gpu.mask_workers) == (0, 15)
    assert cpu.max_decode_waits == gpu.max_decode_waits == T.UNLIMITED_DECODE_WAITS
    # Refills in waves of an eighth of the slots, where slots are kept together (64 slots: 8).
    assert (cpu.refill_wave, gpu.refill_wave) == (0, 64 // T.REFILL_WAVE_DIVISOR)
    assert T.resolve_step_policy(True, False, True, False, 4, 16).refill_wave == 1
    # One KV buffer for all sequences: one forward pass anyway, nothing to pad or reorder.
    unified = T.resolve_step_policy(True, True, True, False, 64, 16)
    assert (unified.max_padded_gap, unified.prompts_first, unified.last_prompt_token_alone) == (0, False, False)
    # Padding is removed by position afterwards: only for memory copyable by position.
    recurrent = T.resolve_step_policy(True, False, False, True, 64, 16)
    assert recurrent.max_padded_gap == 0 and recurrent.prompts_first and not recurrent.share_prefixes
    assert unified.refill_wave == 0 and recurrent.refill_wave == 0
    # One thread: nothing to split a row over.
    assert not T.resolve_step_policy(True, False, True, False, 64, 1).split_rows
    assert not T.resolve_step_policy(False, False, True, True, 1, 16).share_prefixes
    assert T.resolve_step_policy(False, False, True, True, 2, 16).share_prefixes


def test_gaps_between_decoding_slots_are_padded_up_to_the_max_and_not_beyond():
    # Decoding slots 0, 3 and 9: a gap of 2 (padded with max 2), then a gap of 5 (not).
    slots = [decoding(), idle(), idle(), decoding()] + [idle()] * 5 + [decoding()]
    plan = T.plan_step(slots, gpu_policy(max_padded_gap=2), n_batch=64)
    assert plan["pad"] == [False, True, True, False] + [False] * 5 + [False]
    assert plan["n_plan"] == [1, 1, 1, 1] + [0] * 5 + [1]
    assert plan["n_tokens"] == 5
    plan = T.plan_step(slots, gpu_policy(max_padded_gap=5), n_batch=64)
    assert plan["pad"] == [False, True, True, False] + [True] * 5 + [False]
    assert plan["n_tokens"] == 10
    # Idle slots before the first and after the last decoding slot are never padded.
    plan = T.plan_step([idle(), decoding(), idle(), decoding(), idle()], gpu_policy(), n_batch=8)
    assert plan["pad"] == [False, False, True, False, False]


def test_cpu_policy_never_pads():
    slots = [decoding(), idle(), prompt(5, waiting=True), decoding(), idle(), decoding()]
    plan = T.plan_step(slots, cpu_policy(), n_batch=16)
    assert not any(plan["pad"])
    assert plan["n_plan"] == [1, 0, 0, 1, 0, 1]


def test_a_padded_slot_with_a_prompt_chunk_is_not_padding():
    # Slot 1 prefills (3 tokens left) between two decoding slots; slot 2 waits for a prefix.
    slots = [decoding(), prompt(3), prompt(40, waiting=True), decoding()]
    plan = T.plan_step(slots, gpu_policy(last_prompt_token_alone=False), n_batch=8)
    assert plan["pad"] == [False, False, True, False]
    assert plan["n_plan"] == [1, 3, 1, 1]
    assert plan["n_tokens"] == 6
    # Under the whole GPU policy the chunk leaves its last token for a later step (its
    # logits beside the decoding slots' would come out of order).
    plan = T.plan_step(slots, gpu_policy(), n_batch=8)
    assert plan["n_plan"] == [1, 2, 1, 1] and plan["n_tokens"] == 5


def test_prompts_first_take_the_batch_while_prompts_fill_it():
    policy = gpu_policy(equal_chunks=False)  # chunks padded to one length: tested below
    # 2 decoding slots and 30 prompt tokens ready, n_batch 32: 30 >= 32 - 2, prompts first.
    # (Prompts of two lengths: each leaves its last token for a later step.)
    slots = [decoding(), decoding(), prompt(20), prompt(10)]
    plan = T.plan_step(slots, policy, n_batch=32)
    assert plan["prompts_first"]
    assert plan["n_plan"] == [0, 0, 19, 9]
    assert plan["decode_waits"] == 1
    # One token short of filling it: everybody goes, decoding slots first.
    plan = T.plan_step([decoding(), decoding(), prompt(19), prompt(10)], policy, n_batch=32)
    assert not plan["prompts_first"]
    assert plan["n_plan"] == [1, 1, 18, 9]
    assert plan["decode_waits"] == 0
    # A waiting prompt does not count as ready.
    plan = T.plan_step([decoding(), decoding(), prompt(20), prompt(10, waiting=True)], policy, n_batch=32)
    assert not plan["prompts_first"]
    # The CPU policy never lets the decoding slots wait.
    plan = T.plan_step(slots, cpu_policy(), n_batch=32)
    assert not plan["prompts_first"] and plan["n_plan"][:2] == [1, 1]
    # As many decoding slots as the batch holds and no prompt ready: they decode (a step
    # of nothing repeated for ever once hung a one-slot context with n_batch 1 on a GPU).
    for n in (1, 4):
        plan = T.plan_step([decoding()] * n, policy, n_batch=n)
        assert not plan["prompts_first"] and plan["n_plan"] == [1] * n


def test_prompts_first_stops_at_its_decode_waits_limit():
    policy = gpu_policy(max_decode_waits=T.STREAMING_DECODE_WAITS)
    slots = [decoding(), prompt(100), prompt(100)]
    waits, firsts = 0, []
    for step in range(2 * (T.STREAMING_DECODE_WAITS + 1)):
        plan = T.plan_step(slots, policy, n_batch=16, decode_waits=waits)
        firsts.append(plan["prompts_first"])
        waits = plan["decode_waits"]
    # The decoding slot waits at most STREAMING_DECODE_WAITS steps in a row, then decodes.
    period = [True] * T.STREAMING_DECODE_WAITS + [False]
    assert firsts == period * 2
    # Unlimited (generate_parallel): prompts keep the batch while they fill it.
    plan = T.plan_step(slots, gpu_policy(), n_batch=16, decode_waits=10**6)
    assert plan["prompts_first"] and plan["decode_waits"] == 10**6 + 1


def test_first_chunk_takes_what_fits_the_others_only_whole():
    # Budget 10: slot 0 (the oldest) takes 10 of its 25; nothing is left.
    plan = T.plan_step([prompt(25), prompt(3), prompt(4)], cpu_policy(), n_batch=10)
    assert plan["n_plan"] == [10, 0, 0]
    # Slot 1 admitted first: it takes all 3; slot 2 fits whole (4 <= 7); slot 0 (25 > 3) waits.
    plan = T.plan_step([prompt(25, order=3), prompt(3, order=1), prompt(4, order=2)], cpu_policy(), n_batch=10)
    assert plan["n_plan"] == [0, 3, 4]
    # A later prompt that does not fit whole is skipped, a smaller one after it still goes.
    plan = T.plan_step([prompt(6), prompt(9), prompt(2)], cpu_policy(), n_batch=10)
    assert plan["n_plan"] == [6, 0, 2]
    # With decoding slots, the chunks get what they leave.
    plan = T.plan_step([decoding(), prompt(30), decoding()], cpu_policy(), n_batch=10)
    assert plan["n_plan"] == [1, 8, 1]


def test_last_prompt_token_goes_alone_where_logits_rows_differ():
    # Under the GPU policy the rows with logits of a step all have one token count: a
    # chunk that ends its prompt beside decoding slots (or beside a chunk of another
    # length) leaves its last token for a later step, where it goes alone.
    policy = gpu_policy(prompts_first=False)
    plan = T.plan_step([decoding(), prompt(30), decoding(), prompt(5), prompt(1)], policy, n_batch=64)
    assert plan["n_plan"] == [1, 29, 1, 4, 1]
    # Prompts of one length alone, or decoding slots alone: in order already, as planned.
    plan = T.plan_step([prompt(8), prompt(8), prompt(8)], policy, n_batch=64)
    assert plan["n_plan"] == [8, 8, 8]
    plan = T.plan_step([decoding(), idle(), decoding(), prompt(1)], policy, n_batch=64)
    assert plan["n_plan"] == [1, 1, 1, 1] and plan["pad"] == [False, True, False, False]
    # A chunk that does not end its prompt has no logits and changes nothing.
    plan = T.plan_step([decoding(), prompt(40), decoding()], policy, n_batch=10)
    assert plan["n_plan"] == [1, 8, 1]
    # The CPU policy decodes a prompt whole.
    plan = T.plan_step([decoding(), prompt(30), decoding(), prompt(5), prompt(1)], cpu_policy(), n_batch=64)
    assert plan["n_plan"] == [1, 30, 1, 5, 1]


def test_prompts_go_oldest_first_the_most_urgent_before_them():
    # Four long prompts admitted in the order 2, 0, 3, 1, a batch that holds part of one:
    # the oldest takes the batch every step until its prompt is in, then the next oldest.
    # Their prompts end one after another, so each starts generating while the later
    # ones are decoded (taking turns, all would end together, after all of them).
    n_batch = 8
    order = [1, 3, 0, 2]
    left = [20, 20, 20, 20]
    ends = []
    while any(left):
        slots = [prompt(n, order=o) if n else decoding() for n, o in zip(left, order)]
        plan = T.plan_step(slots, cpu_policy(), n_batch=n_batch)
        was = left
        left = [n - k if n else 0 for n, k in zip(left, plan["n_plan"])]
        ends += [i for i in range(4) if was[i] and not left[i]]
    assert ends == [2, 0, 3, 1]
    # A more urgent prompt (a lower priority value) goes before older ones.
    slots = [prompt(20, order=0), prompt(20, order=5, priority=-1), prompt(20, order=1)]
    assert T.plan_step(slots, cpu_policy(), n_batch=8)["n_plan"] == [0, 8, 0]
    # After the oldest, a later prompt goes where it fits whole, whatever its age.
    slots = [prompt(9, order=0), prompt(30, order=1), prompt(3, order=2)]
    assert T.plan_step(slots, cpu_policy(), n_batch=12)["n_plan"] == [9, 0, 3]


def test_prompt_chunks_of_adjacent_slots_are_padded_to_one_length():
    # llama.cpp passes over adjacent slots only as many tokens a slot as the shortest chunk
    # has: chunks of 29, 24 and 27 tokens would take four passes. Padded (throw-away tokens
    # after the shorter ones), the run is one.
    policy = gpu_policy(prompts_first=False)
    plan = T.plan_step([decoding(), prompt(30), prompt(25), prompt(28), decoding()], policy, n_batch=128)
    assert plan["n_plan"] == [1, 29, 24, 27, 1]  # each leaves its last token for the next step
    assert plan["n_pad_tokens"] == [0, 0, 5, 2, 0]
    assert plan["n_tokens"] == 82 + 7
    # A chunk far longer than the others keeps a pass of its own: the run is padded up to the
    # longest length whose throw-away tokens number at most the run's real ones, and at most
    # CHUNK_PADDING_PER_PASS for each shorter length (each a pass saved).
    plan = T.plan_step([prompt(200), prompt(10), prompt(12)], policy, n_batch=512)
    assert plan["n_plan"] == [199, 9, 11] and plan["n_pad_tokens"] == [0, 2, 0]
    per_pass = T.CHUNK_PADDING_PER_PASS
    plan = T.plan_step([prompt(per_pass + 11), prompt(11)], policy, n_batch=1024)
    assert plan["n_pad_tokens"] == [0, per_pass]
    plan = T.plan_step([prompt(per_pass + 12), prompt(11)], policy, n_batch=1024)
    assert plan["n_pad_tokens"] == [0, 0]
    # One token a slot (decoding, a last prompt token, padding) ends a run: llama.cpp's first
    # pass takes one token from each adjacent slot anyway.
    plan = T.plan_step([prompt(8), decoding(), prompt(6), prompt(1), prompt(4)], policy, n_batch=64)
    assert plan["n_plan"] == [7, 1, 5, 1, 3] and plan["n_pad_tokens"] == [0, 0, 0, 0, 0]
    # Throw-away tokens need room in the slot's KV buffer: here only up to 20 tokens.
    slots = [prompt(30), prompt(20, room=20), prompt(10)]
    assert T.plan_step(slots, policy, n_batch=128)["n_pad_tokens"] == [0, 0, 10]
    slots[1].room = 29
    assert T.plan_step(slots, policy, n_batch=128)["n_pad_tokens"] == [0, 10, 20]
    # No room in the batch: the run's highest chunk waits for the next step, or its lowest
    # where the highest is the prompt that goes first (the oldest).
    policy = gpu_policy(prompts_first=False, last_prompt_token_alone=False)
    plan = T.plan_step([prompt(10, order=0), prompt(8, order=1)], policy, n_batch=18)
    assert plan["n_plan"] == [10, 0] and plan["n_pad_tokens"] == [0, 0]
    plan = T.plan_step([prompt(8, order=1), prompt(10, order=0)], policy, n_batch=18)
    assert plan["n_plan"] == [0, 10] and plan["n_pad_tokens"] == [0, 0]
    plan = T.plan_step([prompt(10, order=0), prompt(8, order=1), prompt(9, order=2)], policy, n_batch=29)
    assert plan["n_plan"] == [10, 8, 0] and plan["n_pad_tokens"] == [0, 2, 0]
    # Prompts first, a full batch: the chunk the padding leaves no room for waits a step.
    plan = T.plan_step([decoding(), decoding(), prompt(20), prompt(10)], gpu_policy(), n_batch=32)
    assert plan["prompts_first"] and plan["n_plan"] == [0, 0, 19, 0]
    # The CPU policy, or a rule turned off, pads nothing.
    for policy in (cpu_policy(), gpu_policy(equal_chunks=False)):
        plan = T.plan_step([prompt(30), prompt(25), prompt(28)], policy, n_batch=128)
        assert plan["n_pad_tokens"] == [0, 0, 0]


@pytest.mark.parametrize("gpu", [False, True])
def test_budget_is_never_exceeded_and_every_rule_holds(gpu):
    rng = random.Random(5)
    for _ in range(3000):
        n = rng.randint(1, 24)
        n_batch = rng.randint(n, n + 40) if rng.random() < 0.8 else n  # n_batch >= n_parallel (validated)
        slots = []
        for _ in range(n):
            kind = rng.randrange(4)
            slots.append(idle() if kind == 0 else decoding() if kind == 1 else
                         prompt(rng.randint(1, 60), waiting=kind == 3 and rng.random() < 0.5,
                                order=rng.randrange(100), priority=rng.randint(-1, 1), room=rng.randint(60, 100)))
        policy = gpu_policy(max_padded_gap=rng.randint(0, 6)) if gpu else cpu_policy()
        plan = T.plan_step(slots, policy, n_batch=n_batch, decode_waits=rng.randint(0, 4))
        n_plan, pad, chunk_pads = plan["n_plan"], plan["pad"], plan["n_pad_tokens"]
        assert sum(n_plan) + sum(chunk_pads) == plan["n_tokens"] <= n_batch
        # Throw-away tokens follow a prompt chunk of several tokens, within the slot's room;
        # each run of such chunks is padded to one length, with at most as many as it has.
        run = []
        for i in range(n + 1):
            if i < n and slots[i].prefilling and not pad[i] and n_plan[i] > 1:
                run.append(i)
                continue
            if run:
                padded = {n_plan[j] + chunk_pads[j] for j in run if chunk_pads[j]}
                shorter = {n_plan[j] for j in run if chunk_pads[j]}
                assert len(padded) <= 1 and sum(chunk_pads[j] for j in run) <= sum(n_plan[j] for j in run)
                assert sum(chunk_pads[j] for j in run) <= T.CHUNK_PADDING_PER_PASS * len(shorter)
                assert all(n_plan[j] + chunk_pads[j] <= slots[j].room for j in run)
                if padded:  # every shorter chunk reaches that length, a longer one keeps its own
                    target = padded.pop()
                    assert all(n_plan[j] + chunk_pads[j] == target or not chunk_pads[j] and n_plan[j] > target
                               for j in run)
            run = []
        assert all(k == 0 or s.prefilling and not p and n_plan[i] > 1
                   for i, (s, k, p) in enumerate(zip(slots, chunk_pads, pad)))
        # Every step makes progress while some slot can.
        if any(s.active and not s.waiting for s in slots):
            assert plan["n_tokens"] > sum(pad), (slots, n_batch, plan)
        for s, k, p in zip(slots, n_plan, pad):
            if p:
                assert k == 1 and not (s.active and not s.prefilling)
            elif s.active and not s.prefilling:
                assert k == (0 if plan["prompts_first"] else 1)
            elif s.active and not s.waiting:
                assert 0 <= k <= s.left
            else:
                assert k == 0
        # Only the first chunk (the most urgent, oldest ready prompt's) may be cut, beyond a
        # last token left for a later step.
        spare = 1 if gpu else 0
        cut = [i for i, (s, k, p) in enumerate(zip(slots, n_plan, pad))
               if s.active and s.prefilling and not p and 0 < k < s.left - spare]
        assert len(cut) <= 1
        if cut:  # and it is the most urgent, oldest ready prompt
            ready = [i for i, s in enumerate(slots) if s.active and s.prefilling and not s.waiting]
            assert cut[0] == min(ready, key=lambda i: (slots[i].priority, slots[i].order, i))
        if gpu:  # the rows with logits all have one token count
            counts = {k for s, k, p in zip(slots, n_plan, pad)
                      if k > 0 and not p and (not s.prefilling or k == s.left)}
            assert len(counts) <= 1, (slots, n_plan)
        if not gpu:
            assert not any(pad) and not plan["prompts_first"]
