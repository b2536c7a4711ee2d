// Prefix sharing: a prefilling slot whose prompt starts like another active slot's takes
// that common prefix from the other's KV cache instead of decoding it again. This unit
// keeps the common prefixes and decides each step who copies from whom and who waits; the
// Scheduler does the copies (tests/test_prefix_sharing_unit.py tests the decisions alone).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/base/params.hpp"
#include "llama.h"

namespace fastpar {

// Leading tokens `a` and `b` have in common.
size_t common_prefix(const std::vector<llama_token> & a, const std::vector<llama_token> & b);

// One slot as prefix sharing sees it; slots[i] is sequence i.
struct SharingView {
    bool active = false;
    size_t n_fed = 0;        // prompt tokens in its KV cache (after a copy: the new count)
    size_t prompt_size = 0;  // its prompt's tokens
    // Most positions it may take from another slot: those before it must give logits
    // (scoring, GenerateParams::prompt_logprobs_from) are decoded by the slot itself.
    size_t max_copy = SIZE_MAX;
    // Decided by PrefixSharing::decide:
    bool waiting = false;  // leaves its prefix to a slot ahead of it that is still decoding it
    bool copied = false;   // copies positions [0, n_fed) from `donor`'s KV cache this step
    int32_t donor = -1;

    bool prefilling() const { return n_fed < prompt_size; }
};

class PrefixSharing {
public:
    // `n_slots` slots; a prefix is shared only from `min_shared` tokens on (kMinSharedPrefix:
    // shorter ones cost more to copy than to decode).
    explicit PrefixSharing(size_t n_slots, size_t min_shared = static_cast<size_t>(kMinSharedPrefix));

    // Slot `a` took a new prompt: records what it has in common with active slot `b`'s.
    // `samples`: both are samples of one prompt (GenerateParams::n > 1), which share
    // whatever they have in common, from one position on: the prompt is decoded once.
    void pair_up(size_t a, const std::vector<llama_token> & prompt_a, size_t b,
                 const std::vector<llama_token> & prompt_b, bool samples = false);
    // Slot `a` took a new prompt that must not share with active slot `b`'s.
    void unpair(size_t a, size_t b);
    size_t common(size_t a, size_t b) const { return common_[a * n_slots_ + b]; }

    // Sets waiting / copied / donor / n_fed of every slot for this step, in seq_id order
    // (a slot that copies is no donor this step). The rules:
    // - the whole donor sequence is copied and trimmed back (across the per-slot buffers
    //   of a non-unified cache only whole sequences can be copied), and only if it gains
    //   at least min_shared positions (samples of one prompt: at least one);
    // - a slot whose prefix a slot "ahead" of it (more prompt decoded, or as much and a
    //   lower seq_id) is still decoding waits for it, if it will gain min_shared (samples:
    //   one) more than now; the slot furthest ahead always goes on, so the waits end;
    // - every slot decodes at least its last prompt token itself: its logits start its
    //   generation.
    // Copies commute (donors are never copied into this step), so the caller may make
    // them after the decisions.
    void decide(std::vector<SharingView> & slots) const;

private:
    // Fewest positions worth a copy between slots a and b.
    size_t min_gain(size_t a, size_t b) const { return samples_[a * n_slots_ + b] ? 1 : min_shared_; }

    size_t n_slots_;
    size_t min_shared_;
    std::vector<size_t> common_;  // [a * n_slots + b]
    std::vector<char> samples_;   // [a * n_slots + b]: samples of one prompt
};

}  // namespace fastpar
