// Within-call prefix sharing, the scheduler's part: PrefixSharing (prefix_sharing.hpp)
// decides which slots copy which prefix; this pairs a new prompt with the running ones and
// makes the copies a step asks for.
#include <cstddef>

#include "core/loop/scheduler.hpp"
#include "core/loop/slot.hpp"

namespace fastpar {

// What `slot`'s new prompt has in common with every other active slot's (prefix_sharing.hpp).
void Scheduler::pair_for_sharing(Slot & slot) {
    if (!policy_.share_prefixes && !policy_.share_samples) {
        return;
    }
    for (auto & other : slots_) {
        if (other.get() == &slot || !other->active()) {
            continue;
        }
        const auto a = static_cast<size_t>(slot.seq), b = static_cast<size_t>(other->seq);
        const bool samples = policy_.share_samples && slot.request.group != 0 &&
                             slot.request.group == other->request.group;
        if (samples || policy_.share_prefixes) {
            sharing_.pair_up(a, slot.prompt, b, other->prompt, samples);
        } else {
            sharing_.unpair(a, b);
        }
    }
}

// Prefix sharing decides (prefix_sharing.hpp); the copies are made here: the donor's whole
// sequence is copied and trimmed back to the shared prefix.
void Scheduler::share_prefixes() {
    for (auto & sp : slots_) {
        if (sp->state == SlotState::Waiting) {
            sp->state = SlotState::Prompt;
        }
    }
    if (!policy_.share_prefixes && !policy_.share_samples) {
        return;
    }
    for (size_t i = 0; i < slots_.size(); ++i) {
        const Slot & s = *slots_[i];
        SharingView & h = sharing_views_[i];
        h.active = s.active();
        h.n_fed = s.n_fed;
        h.prompt_size = s.prompt.size();
        // A scoring slot decodes every position whose logits score a token itself.
        h.max_copy = s.scoring.max_copy();
    }
    sharing_.decide(sharing_views_);
    for (size_t i = 0; i < slots_.size(); ++i) {
        Slot & s = *slots_[i];
        const SharingView & h = sharing_views_[i];
        if (h.waiting) {
            s.state = SlotState::Waiting;  // only a slot with prompt to decode waits
        }
        if (!h.copied) {
            continue;
        }
        // A copy that leaves a short suffix after a long prefix copies less, as a cache hit
        // does (tiled_suffix_start); nothing, if the slot already holds that much.
        const size_t n_fed = tiled_suffix_start(h.n_fed, s.prompt.size());
        if (n_fed <= s.n_fed) {
            continue;
        }
        const auto n = static_cast<llama_pos>(n_fed);
        llama_memory_seq_rm(mem_, s.seq, -1, -1);
        llama_memory_seq_cp(mem_, h.donor, s.seq, -1, -1);
        llama_memory_seq_rm(mem_, s.seq, n, -1);
        const auto gained = static_cast<int32_t>(n_fed - s.n_fed);
        s.completion.n_prompt_tokens_shared += gained;
        stats_.n_prompt_tokens_shared += gained;
        s.n_fed = n_fed;
        s.n_past = n;
    }
}

}  // namespace fastpar
