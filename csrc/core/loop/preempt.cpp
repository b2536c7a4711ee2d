// Preemption by priority (GenerateParams::priority, vLLM's): a queued request more urgent
// than a running one (a lower value) does not wait for a slot to free up. The least urgent
// running request, the latest admitted among equals, is suspended: its chain, constraint,
// text and tokens so far are kept with it (Suspended, slot.hpp), its KV stays in the prefix
// cache when there is one, and it is queued again ahead of its equals. When it gets a slot
// again it decodes its prompt and the tokens it had chosen (or takes them from the cache) and
// goes on from the same chain state, so it continues as it would have, up to the rounding of
// the other batch shapes that decode (docs/internals.md, "Priorities").
#include <algorithm>
#include <iterator>

#include "core/loop/scheduler.hpp"
#include "core/loop/slot.hpp"

namespace fastpar {

void Scheduler::preempt() {
    // The queue is ordered by priority: its first requests take the free slots (admit()), and
    // each one after them that is more urgent than a running request takes that one's slot.
    auto n_free = static_cast<size_t>(
        std::count_if(slots_.begin(), slots_.end(), [](const std::unique_ptr<Slot> & s) { return !s->active(); }));
    for (size_t q = 0; q < queue_.size(); ++q) {
        if (n_free > 0) {
            --n_free;
            continue;
        }
        const int32_t want = queue_[q].priority();
        Slot * victim = nullptr;
        for (auto & sp : slots_) {
            Slot & s = *sp;
            // A scoring request's rows are read as they decode: it is never suspended.
            if (!s.active() || s.state == SlotState::Scored || s.scoring.on() || s.request.priority() <= want) {
                continue;
            }
            if (victim == nullptr || s.request.priority() > victim->request.priority() ||
                (s.request.priority() == victim->request.priority() && s.order > victim->order)) {
                victim = &s;
            }
        }
        if (victim == nullptr) {
            return;  // and none queued later is more urgent
        }
        suspend(*victim);  // queued again after q (it is less urgent); its slot is q's
    }
}

void Scheduler::suspend(Slot & s) {
    auto was = std::make_shared<Suspended>();
    const size_t n_prompt = s.prompt.size() - s.n_resumed;
    was->tokens.assign(s.prompt.begin(), s.prompt.begin() + static_cast<std::ptrdiff_t>(n_prompt));
    was->tokens.insert(was->tokens.end(), s.completion.token_ids.begin(), s.completion.token_ids.end());
    if (cache_ != nullptr && s.n_past > 0) {
        cache_->hold(static_cast<size_t>(s.seq), kv_tokens(s));  // found again when it resumes
    } else {
        llama_memory_seq_rm(mem_, s.seq, -1, -1);
    }
    was->sampler = std::move(s.sampler);
    was->shape = s.shape;
    was->grammar = std::move(s.grammar);
    was->thought_open = s.thought_open;
    was->text = std::move(s.text);
    was->completion = std::move(s.completion);
    was->order = s.order;
    s.on_device = false;
    s.state = SlotState::Idle;
    s.prompt.clear();
    s.n_fed = 0;
    s.n_past = 0;
    s.n_resumed = 0;
    s.pending = -1;
    Request request = std::move(s.request);
    s.request = Request();
    request.suspended = std::move(was);
    ++stats_.n_preempted;
    requeue_first(std::move(request));
}

void Scheduler::requeue_first(Request request) {
    // Ahead of every queued request of its priority: it was admitted before them.
    const int32_t priority = request.priority();
    auto at = std::find_if(queue_.begin(), queue_.end(), [&](const Request & r) { return r.priority() >= priority; });
    queue_.insert(at, std::move(request));
}

void Scheduler::resume(Request request) {
    const std::shared_ptr<Suspended> was = std::move(request.suspended);
    Slot & s = pick_slot(was->tokens, true);
    s.sampler = std::move(was->sampler);
    s.shape = was->shape;
    s.on_device = device_ != nullptr && device_->attach(ctx_, s.seq, DeviceSampling::serves(s.shape));
    s.grammar = std::move(was->grammar);
    s.thought_open = was->thought_open;
    s.text = std::move(was->text);
    s.completion = std::move(was->completion);
    // Counted again as this prompt decodes (uncount_resumed takes the generated part out).
    s.completion.n_prompt_tokens = s.completion.n_prompt_tokens_shared = s.completion.n_prompt_tokens_cached = 0;
    s.scoring = PromptScoring();
    s.order = was->order;
    s.request = std::move(request);
    s.prompt = std::move(was->tokens);
    s.n_resumed = s.completion.token_ids.size();
    s.n_fed = 0;
    s.n_past = 0;
    s.pending = -1;
    s.state = SlotState::Prompt;
    reuse_cached(s);
    pair_for_sharing(s);
}

void uncount_resumed(Slot & s) {
    // The generated tokens end the prompt: taken from the decoded count first, then from the
    // shared and cached prefixes, which come before it.
    auto left = static_cast<int32_t>(s.n_resumed);
    for (int32_t * n : {&s.completion.n_prompt_tokens, &s.completion.n_prompt_tokens_shared,
                        &s.completion.n_prompt_tokens_cached}) {
        const int32_t taken = std::min(*n, left);
        *n -= taken;
        left -= taken;
    }
}

}  // namespace fastpar
