// Per-prompt sampler chains built from GenerateParams with llama.h's sampler API.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/params.hpp"
#include "llama.h"

namespace fastpar {

struct SamplerDeleter {
    void operator()(llama_sampler * s) const { llama_sampler_free(s); }
};
using SamplerPtr = std::unique_ptr<llama_sampler, SamplerDeleter>;

// Whether make_sampler puts a penalties sampler first (it needs the token history).
bool has_penalties(const GenerateParams & params);

// penalties -> (greedy | top_k -> top_p -> min_p -> temperature -> dist(seed)).
// `seed` is the resolved seed (never -1).
SamplerPtr make_sampler(const GenerateParams & params, uint32_t seed, int32_t n_vocab);

// What llama_sampler_sample does on the host, from a row of logits the caller already
// holds: applies the chain `params` built (make_sampler), accepts and returns the chosen
// token. Two shortcuts skip building the whole candidate array: a greedy chain without
// penalties is an argmax of the row, and a chain that starts with top-k (no penalties)
// gets only the k best candidates, found in one pass. Safe to call for different chains
// on different threads at once.
llama_token sample_logits(llama_sampler * chain, const GenerateParams & params, const float * logits,
                          int32_t n_vocab, std::vector<llama_token_data> & cur);

// sample_logits for a chain that starts from candidates rather than a whole row (device
// sampling, logit_reducer.hpp): `cur` (unsorted; reordered and trimmed here) must hold
// every token the chain's greedy or top-k step could keep. For a greedy or top-k chain
// without penalties, the token sample_logits picks from the whole row.
llama_token sample_candidates(llama_sampler * chain, const GenerateParams & params,
                              std::vector<llama_token_data> & cur);

// log softmax(logits)[token], over the whole vocabulary.
float token_logprob(const float * logits, int32_t n_vocab, llama_token token);

// The seed every prompt of a call uses: params.seed, or one random draw when it is -1.
uint32_t resolve_seed(const GenerateParams & params);

}  // namespace fastpar
