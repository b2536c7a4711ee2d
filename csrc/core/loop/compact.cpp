// Keeping the running sequences in the first slots (StepPolicy::compact_slots). With one KV
// buffer per slot, llama.cpp computes a step over the slots from the first to the last one
// in it: once sequences of different lengths end and nothing waits to refill their slots,
// those still running are scattered, and every step pads the gaps (or splits at them), so
// it costs a step of all the slots however few run. Moving the highest running sequence
// down into the lowest idle slot (a copy of its whole KV buffer, made by llama.cpp before
// the next step) keeps them in slots 0..n-1, where a step costs what its sequences need
// (docs/internals.md, "Slots kept together": nano-vllm's load 1.39x on an H200).
#include <utility>

#include "core/loop/scheduler.hpp"
#include "core/loop/slot.hpp"

namespace fastpar {

void Scheduler::compact() {
    if (!policy_.compact_slots || !queue_.empty()) {
        return;
    }
    // Only between generation steps: a prompt still decoding may be paired with a donor slot
    // by seq_id (prefix_sharing.hpp), and a scored slot ends after the next step's copies.
    for (const auto & sp : slots_) {
        if (sp->active() && sp->state != SlotState::Generating) {
            return;
        }
    }
    size_t lo = 0;
    size_t hi = slots_.size();
    for (;;) {
        // The lowest idle slot that holds nothing (a slot holding a cached prefix keeps it).
        while (lo < hi && (slots_[lo]->active() || (cache_ != nullptr && !cache_->held(lo).empty()))) {
            ++lo;
        }
        // The highest running slot.
        while (hi > lo && !slots_[hi - 1]->active()) {
            --hi;
        }
        if (hi <= lo) {
            return;
        }
        move_sequence(hi - 1, lo);
        ++lo;
        --hi;
    }
}

void Scheduler::move_sequence(size_t from, size_t to) {
    const auto src = static_cast<llama_seq_id>(from);
    const auto dst = static_cast<llama_seq_id>(to);
    // `to` is idle and holds nothing; the copy of the whole buffer is queued by llama.cpp and
    // made at the start of the next llama_decode, before that step writes any cell.
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
