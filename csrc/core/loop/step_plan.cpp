#include "core/loop/step_plan.hpp"

#include <algorithm>

namespace fastpar {
namespace {

// Equal chunks (step_plan.hpp) over slots [lo, hi), adjacent and each with a prompt chunk;
// `budget`: what the batch has left; `first`: the slot whose prompt goes first this step,
// which never waits for room (else it could wait for ever).
void equalize_run(const std::vector<PlanInput> & slots, StepPlan & out, size_t lo, size_t hi, size_t first,
                  int32_t & budget) {
    auto & chunks = out.run_chunks;
    while (hi - lo >= 2) {
        chunks.clear();
        int64_t real = 0;
        for (size_t i = lo; i < hi; ++i) {
            chunks.emplace_back(out.slots[i].n_plan, slots[i].room);
            real += out.slots[i].n_plan;
        }
        std::sort(chunks.begin(), chunks.end());
        // The longest length worth padding to: throw-away tokens at most the real ones and
        // kChunkPaddingPerPass for each shorter length (a pass saved), in the room of every
        // chunk shorter than it. All only tighten as the length grows.
        int32_t target = 0;
        int64_t pads = 0, n_shorter = 0, sum_shorter = 0, lengths_shorter = 0;
        size_t room_shorter = SIZE_MAX;
        for (size_t k = 0; k < chunks.size(); ++lengths_shorter) {
            const int32_t len = chunks[k].first;
            const int64_t p = static_cast<int64_t>(len) * n_shorter - sum_shorter;
            if (p > real || p > kChunkPaddingPerPass * lengths_shorter || static_cast<size_t>(len) > room_shorter) {
                break;
            }
            target = len;
            pads = p;
            for (; k < chunks.size() && chunks[k].first == len; ++k) {
                ++n_shorter;
                sum_shorter += len;
                room_shorter = std::min(room_shorter, chunks[k].second);
            }
        }
        if (pads == 0) {
            return;  // one length already, or no length worth padding to
        }
        if (pads <= budget) {
            for (size_t i = lo; i < hi; ++i) {
                SlotPlan & p = out.slots[i];
                p.n_pad_tokens = p.n_plan < target ? target - p.n_plan : 0;
            }
            budget -= static_cast<int32_t>(pads);
            return;
        }
        // No room in the batch: the run's highest chunk (its lowest, if the highest goes
        // first) waits for the next step.
        const size_t drop = hi - 1 != first ? --hi : lo++;
        budget += out.slots[drop].n_plan;
        out.slots[drop].n_plan = 0;
    }
}

}  // namespace

void plan_step(const std::vector<PlanInput> & slots, const StepPolicy & policy, int32_t n_batch,
               int32_t decode_waits, StepPlan & out) {
    const size_t n = slots.size();
    out.slots.assign(n, SlotPlan{});
    size_t n_decoding = 0;
    size_t n_prompt_ready = 0;  // prompt tokens that could be decoded now
    for (const PlanInput & s : slots) {
        if (!s.active) {
            continue;
        }
        if (!s.prefilling) {
            ++n_decoding;
        } else if (!s.waiting) {
            n_prompt_ready += s.left;
        }
    }
    // The decoding slots' tokens and the prompt chunks would be separate forward passes
    // anyway; once every prompt is in, all slots decode together in one. Some prompt token
    // must be ready: with as many decoding slots as the batch holds (n_batch == n_parallel,
    // one slot and n_batch 1), "fills the batch" holds for none, and a step of nothing
    // would repeat for ever.
    const bool prompts_first = policy.prompts_first && n_decoding > 0 && n_prompt_ready > 0 &&
                               decode_waits < policy.max_decode_waits &&
                               n_prompt_ready >= static_cast<size_t>(n_batch) - n_decoding;
    out.prompts_first = prompts_first;
    out.decode_waits = prompts_first ? decode_waits + 1 : 0;

    int32_t budget = n_batch;
    if (!prompts_first) {
        bool have_previous = false;
        size_t previous = 0;  // the last decoding slot before i
        for (size_t i = 0; i < n; ++i) {
            if (!slots[i].active || slots[i].prefilling) {
                continue;
            }
            out.slots[i].n_plan = 1;
            --budget;
            const size_t gap = have_previous ? i - previous - 1 : 0;
            if (gap > 0 && gap <= policy.max_padded_gap) {
                for (size_t q = previous + 1; q < i; ++q) {
                    out.slots[q].pad = true;
                    out.slots[q].n_plan = 1;
                    --budget;
                }
            }
            have_previous = true;
            previous = i;
        }
    }

    std::vector<size_t> & queue = out.prompt_queue;
    queue.clear();
    for (size_t i = 0; i < n; ++i) {
        if (slots[i].active && slots[i].prefilling && !slots[i].waiting) {
            queue.push_back(i);
        }
    }
    std::sort(queue.begin(), queue.end(), [&](size_t a, size_t b) {
        const PlanInput & x = slots[a];
        const PlanInput & y = slots[b];
        return x.priority != y.priority ? x.priority < y.priority : x.order != y.order ? x.order < y.order : a < b;
    });
    bool first = true;
    for (size_t k = 0; k < queue.size() && budget > 0; ++k) {
        const size_t i = queue[k];
        const PlanInput & s = slots[i];
        SlotPlan & p = out.slots[i];
        const auto room = static_cast<size_t>(budget + (p.pad ? 1 : 0));
        if (!first && s.left > room) {
            continue;
        }
        first = false;
        p.n_plan = static_cast<int32_t>(std::min(s.left, room));
        p.pad = false;
        budget = static_cast<int32_t>(room) - p.n_plan;
    }
    if (policy.last_prompt_token_alone) {
        // Rows with logits (a decoding slot's token, a chunk's last token when it ends its
        // prompt) of different token counts come out of llama.cpp's passes out of batch
        // order (step_policy.hpp): then every chunk that ends its prompt leaves its last
        // token for a later step, where it goes alone. Rows all of one count (the usual
        // generation step, or prompts of one length) come out in order and stay as planned.
        int32_t count = 0;
        bool differ = false;
        for (size_t i = 0; i < n; ++i) {
            const SlotPlan & p = out.slots[i];
            const bool logits = p.n_plan > 0 && !p.pad &&
                                (!slots[i].prefilling || static_cast<size_t>(p.n_plan) == slots[i].left);
            if (logits) {
                differ = differ || (count != 0 && p.n_plan != count);
                count = p.n_plan;
            }
        }
        for (size_t i = 0; differ && i < n; ++i) {
            SlotPlan & p = out.slots[i];
            if (slots[i].prefilling && !p.pad && p.n_plan > 1 && static_cast<size_t>(p.n_plan) == slots[i].left) {
                --p.n_plan;
                ++budget;
            }
        }
    }
    if (policy.equal_chunks) {
        const size_t oldest = queue.empty() ? SIZE_MAX : queue.front();
        // A slot adding one token (a decoding slot, a prompt's last token, padding) ends a run:
        // llama.cpp's first pass over adjacent slots takes one token from each anyway.
        auto chunk = [&](size_t i) { return slots[i].prefilling && !out.slots[i].pad && out.slots[i].n_plan > 1; };
        for (size_t lo = 0; lo < n;) {
            if (!chunk(lo)) {
                ++lo;
                continue;
            }
            size_t hi = lo + 1;
            while (hi < n && chunk(hi)) {
                ++hi;
            }
            equalize_run(slots, out, lo, hi, oldest, budget);
            lo = hi;
        }
    }
    out.n_tokens = n_batch - budget;
}

}  // namespace fastpar
