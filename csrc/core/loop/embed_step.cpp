// An embeddings context's step (ContextParams::embeddings): the same slots, queue and
// admission as generation, but each text is decoded whole in one batch, every token an
// output, and ends in that step with its pooled vector.
#include <algorithm>
#include <cmath>
#include <string>

#include "core/base/text.hpp"
#include "core/loop/scheduler.hpp"
#include "core/loop/slot.hpp"

namespace fastpar {
namespace {

// Scales v to unit Euclidean length, as llama-embedding's default (--embd-normalize 2)
// does: the sum in double, a zero vector left as it is.
void normalize_l2(std::vector<float> & v) {
    double sum = 0.0;
    for (const float x : v) {
        sum += static_cast<double>(x) * x;
    }
    const double norm = sum > 0.0 ? 1.0 / std::sqrt(sum) : 0.0;
    for (float & x : v) {
        x = static_cast<float>(x * norm);
    }
}

}  // namespace

std::string Scheduler::embedding_refusal(const Prompt & prompt, size_t n_tokens) const {
    if (n_tokens == 0 || (!prompt.is_tokens && !prompt.is_chat && prompt.text.empty())) {
        return "text is empty: there is nothing to embed";
    }
    // Python's and R's strings are valid UTF-8; C's may not be, and would embed what the
    // tokenizer makes of the bytes.
    if (!prompt.is_tokens && !prompt.is_chat && utf8_sanitize(prompt.text) != prompt.text) {
        return "text is not valid UTF-8";
    }
    // Whole in one batch (pooling covers one batch's tokens of a sequence), within a slot's
    // positions and within the positions the model was trained for (an encoder's learned
    // position table has no row beyond them).
    size_t limit = static_cast<size_t>(n_batch_);
    std::string why = "n_batch";
    if (static_cast<size_t>(n_ctx_seq_) < limit) {
        limit = static_cast<size_t>(n_ctx_seq_);
        why = "n_ctx_per_seq";
    }
    const int32_t n_train = llama_model_n_ctx_train(model_.get());
    if (n_train > 0 && static_cast<size_t>(n_train) < limit) {
        limit = static_cast<size_t>(n_train);
        why = "the model's training context";
    }
    if (n_tokens > limit) {
        return "text has " + std::to_string(n_tokens) + " tokens, but this embeddings context takes at most " +
               std::to_string(limit) + " (" + why + "): a text is embedded whole, in one batch; shorten it" +
               (why == "the model's training context" ? std::string() : " or raise " + why);
    }
    return std::string();
}

void Scheduler::step_embeddings() {
    reap_cancelled();
    admit();
    std::vector<Slot *> ready;
    for (auto & s : slots_) {
        if (s->state == SlotState::Prompt) {
            ready.push_back(s.get());
        }
    }
    // Oldest first, so a long text is never passed over for good; younger ones fill the rest
    // of the step's tokens (embed_step_tokens_, or the oldest text's own length if more).
    std::sort(ready.begin(), ready.end(), [](const Slot * a, const Slot * b) { return a->order < b->order; });
    std::vector<Slot *> group;
    size_t budget = static_cast<size_t>(embed_step_tokens_);
    if (!ready.empty()) {
        budget = std::max(budget, ready.front()->prompt.size());
    }
    size_t n = 0;
    for (Slot * s : ready) {
        if (n + s->prompt.size() <= budget) {
            group.push_back(s);
            n += s->prompt.size();
        }
    }
    if (!group.empty()) {
        decode_embeddings(std::move(group));
    }
}

void Scheduler::decode_embeddings(std::vector<Slot *> group) {
    batch_.n_tokens = 0;
    for (Slot * s : group) {
        for (size_t j = 0; j < s->prompt.size(); ++j) {
            batch_add(batch_, s->prompt[j], static_cast<llama_pos>(j), s->seq, true);
        }
    }
    if (threads_ != nullptr) {
        const int32_t n = threads_->threads();
        stats_.n_threads_low = stats_.n_threads_low == 0 ? n : std::min(stats_.n_threads_low, n);
    }
    const auto t0 = Clock::now();
    const int32_t rc = llama_decode(ctx_, batch_);
    if (rc == 0) {
        llama_synchronize(ctx_);
    }
    stats_.t_prompt_ms += ms_since(t0);
    if (threads_ != nullptr) {
        threads_->after_decode(ctx_);
    }
    ++stats_.n_decode_calls;
    if (rc == 0) {
        const auto n_embd = static_cast<size_t>(embedding_size_);
        for (Slot * s : group) {
            const auto n_tokens = static_cast<int32_t>(s->prompt.size());
            s->completion.n_prompt_tokens = n_tokens;
            stats_.n_prompt_tokens += n_tokens;
            const float * e = llama_get_embeddings_seq(ctx_, s->seq);
            if (e == nullptr) {
                finish(*s, FinishReason::Error, "llama.cpp gave no pooled vector for this text");
                continue;
            }
            std::vector<float> v(e, e + n_embd);
            if (s->request.embed.normalize) {
                normalize_l2(v);
            }
            s->completion.embedding = std::move(v);
            finish(*s, FinishReason::Stop);  // removes the text's sequence: nothing is kept
        }
        return;
    }
    // Failed: nothing of this batch stays; the texts are retried in halves until the one
    // that fails is found, and it fails alone.
    for (Slot * s : group) {
        llama_memory_seq_rm(mem_, s->seq, -1, -1);
    }
    if (rc == 2) {
        return;  // aborted on purpose (closing): the texts are still waiting, the caller decides
    }
    if (group.size() > 1) {
        const auto mid = group.begin() + static_cast<std::ptrdiff_t>(group.size() / 2);
        decode_embeddings(std::vector<Slot *>(group.begin(), mid));
        decode_embeddings(std::vector<Slot *>(mid, group.end()));
        return;
    }
    finish(*group.front(), FinishReason::Error, decode_error_message(rc));
}

}  // namespace fastpar
