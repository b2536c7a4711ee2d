// Planning one step of the loop: which slots add which tokens to the batch. A pure
// function over a plain description of the slots, so that its rules (GPU ones included)
// are tested without a model (tests/test_step_plan.py).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/loop/step_policy.hpp"

namespace fastpar {

// One slot as the planner sees it; slots[i] is sequence i.
struct PlanInput {
    bool active = false;      // holds a request
    bool prefilling = false;  // still has prompt tokens to decode (else: decodes one token)
    bool waiting = false;     // leaves its prompt prefix to another slot this step (prefix_sharing.hpp)
    size_t left = 0;          // prompt tokens still to decode
    size_t room = SIZE_MAX;   // KV cells its buffer has free: its chunk and throw-away tokens fit in them
    // Which prompt's chunk goes first: the lower priority value (the more urgent), then the
    // earlier admitted (Slot::order), then the lower slot.
    int32_t priority = 0;
    uint64_t order = 0;
};

// What the plan has one slot do this step.
struct SlotPlan {
    int32_t n_plan = 0;  // tokens the slot adds to the batch (0: not in this step)
    bool pad = false;    // adds one throw-away token only, to keep the step one forward pass
    int32_t n_pad_tokens = 0;  // throw-away tokens after its prompt chunk (policy.equal_chunks)
};

struct StepPlan {
    std::vector<SlotPlan> slots;  // [seq]
    int32_t decode_waits = 0;     // steps in a row the decoding slots have waited, after this one
    bool prompts_first = false;   // this step the decoding slots wait for the prompts
    int32_t n_tokens = 0;         // tokens in the batch, at most n_batch
    std::vector<size_t> prompt_queue;  // scratch: the prompts ready this step, first to go first
    std::vector<std::pair<int32_t, size_t>> run_chunks;  // scratch: a run's chunk lengths and rooms
};

// The rules, in order:
// - Prompts first (policy.prompts_first): while prompt tokens ready to decode fill the
//   batch beside the decoding slots, they take it and the decoding slots wait, at most
//   policy.max_decode_waits steps in a row (`decode_waits` so far).
// - Otherwise every decoding slot adds its one token (n_batch >= n_parallel leaves room),
//   and a gap of at most policy.max_padded_gap idle slots between two of them is padded.
// - Prompt chunks fill the rest of n_batch, the most urgent prompt first and among equals
//   the oldest: it takes what fits, the others go only whole (a cut prompt ends in a pass
//   of its own next step). None starves. Oldest first rather than taking turns, so that
//   prompts end one after another and each generates beside the later ones' chunks, where
//   taking turns ended them all together (docs/internals.md, "A step"). A padded slot that
//   gets a chunk is no longer padding.
// - Equal chunks (policy.equal_chunks): each run of adjacent slots with prompt chunks of
//   more than one token and of different lengths is padded with throw-away tokens after
//   the shorter chunks up to the longest length L whose throw-away tokens number at most
//   the run's real ones and kChunkPaddingPerPass for each shorter length, and fit in every
//   padded slot's buffer; chunks longer than L stay as they are. Where the batch has no
//   room for them, the run's highest chunks (or its lowest, if the highest goes first) wait
//   for the next step.
// `out` is reused from step to step (no allocation once it has grown to the slots).
void plan_step(const std::vector<PlanInput> & slots, const StepPolicy & policy, int32_t n_batch,
               int32_t decode_waits, StepPlan & out);

}  // namespace fastpar
