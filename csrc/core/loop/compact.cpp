// Keeping the running sequences in the first slots (StepPolicy::compact_slots). With one KV
// buffer per slot, llama.cpp computes a step over the slots from the first to the last one in
// it: once sequences of different lengths end and nothing waits to refill their slots (or,
// with refills in waves, the next wave has not come), those still running are scattered, and
// every step pads the gaps (or splits at them), so it costs a step of all the slots however
// few run; and a wave's prompts would land scattered, a pass each. Moving the highest running
// sequence down into the lowest idle slot above the lowest running one (a copy of its whole KV
// buffer, made by llama.cpp before the next step) keeps them side by side, where a step costs
// what its sequences need (docs/internals.md, "Slots kept together": nano-vllm's load 1.39x on
// an H200). A cached sequence in such a slot moves aside first (vacate_held), unless letting
// it go might copy it to host memory: then the slot is passed over. Such a sequence is usually
// a conversation whose next turn comes back to it; saving it and restoring it then copies its
// whole KV twice while the device waits (on a GPU ~115 KB a token for the speed model), far
// more than a step one slot wider costs.
#include <utility>

#include "core/loop/prefix_cache.hpp"
#include "core/loop/scheduler.hpp"
#include "core/loop/slot.hpp"

namespace fastpar {

void Scheduler::compact() {
    if (!policy_.compact_slots || (!queue_.empty() && policy_.refill_wave == 0)) {
        return;
    }
    // Only between generation steps: a prompt still decoding may be paired with a donor slot
    // by seq_id (prefix_sharing.hpp), and a scored slot ends after the next step's copies.
    size_t lo = slots_.size();  // the lowest running slot: gaps above it are filled
    for (size_t i = 0; i < slots_.size(); ++i) {
        if (slots_[i]->active() && slots_[i]->state != SlotState::Generating) {
            return;
        }
        if (slots_[i]->active() && lo == slots_.size()) {
            lo = i;
        }
    }
    size_t hi = slots_.size();
    bool none_empty = false;  // vacate_held found no empty idle slot, and no move emptied one since
    for (;;) {
        // The lowest idle slot above the lowest running one, and the highest running slot.
        while (lo < hi && slots_[lo]->active()) {
            ++lo;
        }
        while (hi > lo && !slots_[hi - 1]->active()) {
            --hi;
        }
        if (hi <= lo) {
            return;
        }
        if (cache_ != nullptr && !cache_->held(lo).empty() &&
            ((none_empty && cache_->may_save(lo)) || !vacate_held(lo))) {
            none_empty = true;
            ++lo;  // its sequence stays; the next idle slot above may take the move
            continue;
        }
        move_sequence(hi - 1, lo);
        none_empty = false;  // the slot the sequence left is empty
        ++lo;
        --hi;
    }
}

// An idle slot in a gap holds a cached sequence: it moves to an empty idle slot (a copy on the
// device, queued before the move into `seq`), or, with none empty, is dropped while the cache
// saves nothing. Then the slot the running sequence leaves is empty: one pass, or a whole
// call, drops at most one. Returns false, changing nothing, where letting it go might copy it
// to host memory (and back when its prompt returns): PrefixCache::may_save.
bool Scheduler::vacate_held(size_t seq) {
    size_t to = slots_.size();
    for (size_t i = slots_.size(); i-- > 0;) {
        if (!slots_[i]->active() && cache_->held(i).empty() && llama_memory_seq_pos_max(mem_, slots_[i]->seq) < 0) {
            to = i;
            break;
        }
    }
    const auto src = static_cast<llama_seq_id>(seq);
    if (to < slots_.size()) {
        llama_memory_seq_cp(mem_, src, static_cast<llama_seq_id>(to), -1, -1);
        cache_->move_held(seq, to);
    } else if (cache_->may_save(seq)) {
        return false;
    } else {
        cache_->let_go(ctx_, seq);  // dropped: may_save said it would not be saved
    }
    llama_memory_seq_rm(mem_, src, -1, -1);
    return true;
}

void Scheduler::move_sequence(size_t from, size_t to) {
    const auto src = static_cast<llama_seq_id>(from);
    const auto dst = static_cast<llama_seq_id>(to);
    // `to` is idle and holds nothing now; the copy of the whole buffer is queued by llama.cpp
    // and made at the start of the next llama_decode (copies in the order they were queued),
    // before that step writes any cell.
    llama_memory_seq_rm(mem_, dst, -1, -1);
    llama_memory_seq_cp(mem_, src, dst, -1, -1);
    llama_memory_seq_rm(mem_, src, -1, -1);
    std::swap(slots_[from], slots_[to]);
    slots_[from]->seq = src;
    Slot & s = *slots_[to];
    s.seq = dst;
    // Its device-sampling chain goes with it; `from` keeps its own for its next request.
    s.on_device = device_ != nullptr && device_->attach(ctx_, dst, DeviceSampling::serves(s.shape));
}

}  // namespace fastpar
