// Per-prompt sampler chains built from GenerateParams with llama.h's sampler API.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
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

// A row of logits to sample from: the whole vocabulary (`blocks` null: logits[t] is token
// t's), or the blocks device sampling kept (logit_reducer.hpp): n / width blocks, block b
// holding the logits of tokens blocks[b] * width .. blocks[b] * width + width - 1.
struct LogitRow {
    const float * logits = nullptr;
    int32_t n = 0;
    const llama_token * blocks = nullptr;
    int32_t width = 0;

    llama_token id(int32_t j) const { return blocks == nullptr ? j : blocks[j / width] * width + j % width; }
};

// What llama_sampler_sample does on the host, from a row of logits the caller already
// holds: applies the chain `params` built (make_sampler), accepts and returns the chosen
// token. Two shortcuts skip building the whole candidate array: a greedy chain without
// penalties is an argmax of the row, and a chain that starts with top-k (no penalties)
// gets only the k best candidates, found in one pass; ties go to the lower token id, as
// in llama.cpp's samplers. A row of device-sampling blocks takes only those two kinds of
// chain (LogitReducer::serves) and gives the token the whole row would. Safe to call for
// different chains on different threads at once.
llama_token sample_logits(llama_sampler * chain, const GenerateParams & params, const LogitRow & row,
                          std::vector<llama_token_data> & cur);

// For tests: `draws` tokens sample_logits picks with the chain `params` builds, from the
// whole row `logits` or, when `blocks` is not empty, from those blocks of `width` logits
// (as device sampling hands them over), next to the tokens llama.cpp's own chain picks
// applying every sampler to the whole row; both chains start from `seed`.
std::pair<std::vector<llama_token>, std::vector<llama_token>> sample_against_llama(
    const GenerateParams & params, uint32_t seed, const std::vector<float> & logits,
    const std::vector<llama_token> & blocks, int32_t width, int32_t draws);

// log softmax(logits)[token], over the whole vocabulary.
float token_logprob(const float * logits, int32_t n_vocab, llama_token token);

// The seed every prompt of a call uses: params.seed, or one random draw when it is -1.
uint32_t resolve_seed(const GenerateParams & params);

}  // namespace fastpar
