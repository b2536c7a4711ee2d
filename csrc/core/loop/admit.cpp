#include "core/loop/admit.hpp"

#include <string>

#include "core/base/errors.hpp"

namespace fastpar {

void tokenize_prompt(const Model & model, const Prompt & prompt, Tokenized & out) {
    try {
        if (prompt.is_tokens) {
            const int32_t n_vocab = model.n_vocab();
            for (size_t i = 0; i < prompt.tokens.size(); ++i) {
                if (prompt.tokens[i] < 0 || prompt.tokens[i] >= n_vocab) {
                    throw InvalidArgument("prompt token " + std::to_string(i) + " is " +
                                          std::to_string(prompt.tokens[i]) + ", not a token id of this model (0 to " +
                                          std::to_string(n_vocab - 1) + ")");
                }
            }
            out.tokens.assign(prompt.tokens.begin(), prompt.tokens.end());
            return;
        }
        out.tokens = model.tokenize(prompt.is_chat ? model.apply_chat_template(prompt.messages) : prompt.text);
    } catch (const std::exception & e) {
        out.failed = true;
        out.error = e.what();
    }
}

std::optional<Completion> refusal(const Tokenized & t, const GenerateParams & params, int32_t n_ctx_seq) {
    Completion c;
    c.finish_reason = FinishReason::Error;
    if (t.failed) {
        c.error = t.error;
        return c;
    }
    const std::vector<llama_token> & tokens = t.tokens;
    if (tokens.empty()) {
        c.error = "prompt is empty: it tokenizes to no tokens, so there is nothing to continue";
        return c;
    }
    // Scoring alone never decodes the last token, and keeps no position for
    // generation: n_ctx_seq positions score n_ctx_seq + 1 tokens.
    const bool score_only = params.prompt_logprobs && params.max_tokens == 0;
    if (tokens.size() >= static_cast<size_t>(n_ctx_seq) + (score_only ? 2 : 0)) {
        c.error = "prompt has " + std::to_string(tokens.size()) + " tokens, but n_ctx_per_seq=" +
                  std::to_string(n_ctx_seq) + " allows at most " +
                  (score_only ? std::to_string(n_ctx_seq + 1) + " to score"
                              : std::to_string(n_ctx_seq - 1) + " (one position is kept for generation)") +
                  "; raise n_ctx_per_seq or shorten it";
        return c;
    }
    if (params.max_tokens == 0 && (!score_only || tokens.size() < 2)) {
        c.finish_reason = FinishReason::Length;
        if (score_only) {
            // One token: nothing to decode, nothing to score but the first.
            init_prompt_logprobs(c, tokens, params);
        }
        return c;
    }
    return std::nullopt;
}

void start_slot(Slot & slot, Request && request, std::vector<llama_token> tokens) {
    const GenerateParams & params = *request.params;
    if (request.on_start) {
        request.on_start();
    }
    slot.completion = Completion();
    slot.scoring = PromptScoring();
    if (params.prompt_logprobs) {
        slot.scoring.tokens = tokens;
        slot.scoring.from = static_cast<size_t>(params.prompt_logprobs_from);
        init_prompt_logprobs(slot.completion, tokens, params);
        if (params.max_tokens == 0) {
            tokens.pop_back();  // scored only: its logits would predict nothing
        }
    }
    slot.request = std::move(request);
    slot.prompt = std::move(tokens);
    slot.n_fed = 0;
    slot.n_past = 0;
    slot.pending = -1;
    slot.text.reset(static_cast<bool>(slot.request.on_text));
    slot.completion.t_queued_ms = ms_since(slot.request.t_submit);
    slot.state = SlotState::Prompt;
}

}  // namespace fastpar
