// A sampler chain's shape: which samplers make_sampler puts in a request's chain, and what
// a row of logits must hold for it. Computed once, where the chain is built, as vLLM's
// SamplingParams computes its sampling type once: every choice that depends on the kind of
// chain (sample_logits' shortcuts, splitting a row over threads, a step's work, device
// sampling, constrained choice) reads it instead of re-deriving it from the options.
#pragma once

#include <cstdint>

#include "core/base/params.hpp"

namespace fastpar {

struct ChainShape {
    bool bias = false;       // a logit-bias sampler comes first (logit_bias, allowed_token_ids)
    bool penalties = false;  // then a penalties sampler (it needs the token history)
    bool greedy = false;     // temperature 0: the greedy sampler ends the chain
    int32_t top_k = 0;       // the top-k sampler's k (after any penalties); 0 = none, always with greedy
    // The request needs whole rows of logits whatever its chain: log-probabilities
    // (logprobs, top_logprobs, prompt_logprobs) are over the whole vocabulary, and the
    // tokens a json_schema, grammar or choice allows may all lie outside any candidates.
    bool whole_rows = false;

    static ChainShape of(const GenerateParams & p) {
        ChainShape s;
        s.bias = !p.logit_bias.empty() || !p.allowed_token_ids.empty();
        s.penalties = p.repeat_penalty != 1.0f || p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f;
        s.greedy = p.temperature <= 0.0f;
        s.top_k = s.greedy ? 0 : p.top_k;
        s.whole_rows = p.logprobs || p.prompt_logprobs || p.top_logprobs > 0 || constrained(p);
        return s;
    }

    // The choice is the row's largest logit (greedy, no bias or penalties).
    bool argmax() const { return greedy && !bias && !penalties; }
    // How many of a row's best candidates the chain keeps before any other sampler sees
    // them, which are then all it needs: 1 greedy, k with top-k; 0 (the whole row) with a
    // bias or penalties first, which change logits outside the best, or with neither.
    int32_t keeps_best() const { return bias || penalties ? 0 : greedy ? 1 : top_k; }
};

}  // namespace fastpar
