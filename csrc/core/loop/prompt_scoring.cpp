#include "core/loop/prompt_scoring.hpp"

#include <chrono>
#include <limits>

#include "core/base/errors.hpp"
#include "core/base/text.hpp"
#include "core/loop/slot.hpp"
#include "core/sampling/sampling.hpp"

namespace fastpar {

void init_prompt_logprobs(Completion & completion, const std::vector<llama_token> & tokens,
                          const GenerateParams & params) {
    completion.prompt_token_ids.assign(tokens.begin(), tokens.end());
    completion.prompt_logprobs.assign(tokens.size(), std::numeric_limits<float>::quiet_NaN());
    completion.prompt_greedy.assign(tokens.size(), 0);
    if (params.top_logprobs > 0) {
        completion.prompt_top_logprobs.assign(tokens.size(), {});
    }
}

std::vector<TopLogprob> top_logprob_entries(const Model & model,
                                            const std::vector<std::pair<llama_token, float>> & top) {
    std::vector<TopLogprob> entries;
    entries.reserve(top.size());
    for (const auto & [id, lp] : top) {
        entries.push_back(TopLogprob{id, lp, utf8_sanitize(model.token_piece(id))});
    }
    return entries;
}

void score_rows(const std::vector<Slot *> & group, llama_context * ctx, const Model & model, TaskPool * pool,
                Stats & stats) {
    struct Row {
        const float * logits;
        llama_token token;
        Slot * slot;
        size_t pos;  // of the scored token
        float logprob;
        bool greedy;
        std::vector<std::pair<llama_token, float>> top;  // with top_logprobs
    };
    std::vector<Row> rows;
    for (Slot * s : group) {
        const PromptScoring & sc = s->scoring;
        for (int32_t k = 0; k < sc.n_rows; ++k) {
            // Read on this thread: llama.cpp's accessors are not thread-safe.
            const float * logits = llama_get_logits_ith(ctx, sc.i_row + k);
            if (logits == nullptr) {
                throw Error("llama.cpp returned no logits for a prompt token that asked for them");
            }
            const size_t pos = sc.first_pos + static_cast<size_t>(k) + 1;
            rows.push_back(Row{logits, sc.tokens[pos], s, pos, 0.0f, false, {}});
        }
    }
    if (rows.empty()) {
        return;
    }
    const auto t0 = std::chrono::steady_clock::now();
    const int32_t n_vocab = model.n_vocab();
    const auto one = [&](size_t i) {
        Row & r = rows[i];
        score_token(r.logits, n_vocab, r.token, r.logprob, r.greedy);
        const int32_t k = r.slot->request.params->top_logprobs;
        if (k > 0) {
            top_logprobs(r.logits, n_vocab, k, r.top);
        }
    };
    if (pool != nullptr && rows.size() > 1) {
        pool->run(rows.size(), one);
    } else {
        for (size_t i = 0; i < rows.size(); ++i) {
            one(i);
        }
    }
    for (const Row & r : rows) {
        r.slot->completion.prompt_logprobs[r.pos] = r.logprob;
        r.slot->completion.prompt_greedy[r.pos] = r.greedy ? 1 : 0;
        if (!r.top.empty()) {
            r.slot->completion.prompt_top_logprobs[r.pos] = top_logprob_entries(model, r.top);
        }
    }
    stats.t_sample_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace fastpar
