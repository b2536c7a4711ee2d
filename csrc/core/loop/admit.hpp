// Admitting a queued request into a free slot (Scheduler::admit, defined in admit.cpp with
// the slot's choice and its start from the prefix cache): its prompt's tokens, the checks
// that may refuse it before it takes a slot (a refusal ends that request alone), and the
// slot's set-up for it. The scheduler keeps the order: tokenize, refuse, compile the
// constraint, build the chain, start the slot, pair it for prefix sharing.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/base/params.hpp"
#include "core/base/results.hpp"
#include "core/loop/slot.hpp"
#include "core/model/model.hpp"
#include "llama.h"

namespace fastpar {

// A prompt's tokens, or why it has none.
struct Tokenized {
    std::vector<llama_token> tokens;
    bool thought_open = false;  // with reasoning "split": the prompt ends inside a thought
    bool failed = false;
    std::string error;
};

// `prompt`'s tokens: its text (chat messages rendered with the model's template first)
// tokenized, or its token ids checked against the vocabulary. Safe on several threads at
// once (llama_tokenize is thread-safe), never throws.
// With `reasoning` "off" a chat prompt's thought is closed; with "split" thought_open is set.
void tokenize_prompt(const Model & model, const Prompt & prompt, const std::string & reasoning, Tokenized & out);

// The completion that ends a request with prompt `t` before it takes a slot, or none: it
// may take one. In this order: tokenizing failed, its logit_bias names a token outside the
// model's `n_vocab`, the prompt is empty, it is too long for `n_ctx_seq` positions (error),
// or there is nothing to decode (length: max_tokens = 0 without scoring, or scoring a
// one-token prompt, whose only log-probability is NaN). The completion's times are the
// caller's to set.
std::optional<Completion> refusal(const Tokenized & t, const GenerateParams & params, int32_t n_ctx_seq,
                                  int32_t n_vocab);

// Starts `request` in `slot`, whose sampler and constraint are set already: calls its
// on_start, sets up its prompt scoring, and leaves the slot decoding prompt `tokens`.
void start_slot(Slot & slot, Request && request, std::vector<llama_token> tokens);

}  // namespace fastpar
