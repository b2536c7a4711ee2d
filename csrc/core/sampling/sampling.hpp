// Per-prompt sampler chains built from GenerateParams with llama.h's sampler API.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "core/base/params.hpp"
#include "core/sampling/chain_shape.hpp"
#include "core/threads/pool.hpp"
#include "llama.h"

namespace fastpar {

struct SamplerDeleter {
    void operator()(llama_sampler * s) const;
};
using SamplerPtr = std::unique_ptr<llama_sampler, SamplerDeleter>;

// logit bias -> penalties -> (greedy | top_k -> top_p -> min_p -> temperature -> dist(seed)), the
// samplers ChainShape::of(params) names. `seed` is the resolved seed (never -1).
SamplerPtr make_sampler(const GenerateParams & params, uint32_t seed, int32_t n_vocab);

// A row of logits to sample from: the whole vocabulary (`blocks` null: logits[t] is token
// t's), or the blocks device sampling kept (device_sampling.hpp): n / width blocks, block b
// holding the logits of tokens blocks[b] * width .. blocks[b] * width + width - 1.
struct LogitRow {
    const float * logits = nullptr;
    int32_t n = 0;
    const llama_token * blocks = nullptr;
    int32_t width = 0;
    // A whole row's block maxima, computed ahead (choose_split); null: sample_logits
    // computes them itself where it needs them.
    const float * maxima = nullptr;

    llama_token id(int32_t j) const { return blocks == nullptr ? j : blocks[j / width] * width + j % width; }
};

// What llama_sampler_sample does on the host, from a row of logits the caller already
// holds: applies `chain` (make_sampler), of shape `shape`, accepts and returns the chosen
// token. Two shortcuts skip building the whole candidate array: a greedy chain without
// penalties is an argmax of the row, and a chain that starts with top-k (no penalties)
// gets only the k best candidates, found in one pass; ties go to the lower token id, as
// in llama.cpp's samplers. A row of device-sampling blocks takes only those two kinds of
// chain (DeviceSampling::serves) and gives the token the whole row would. Safe to call for
// different chains on different threads at once. With `accept` false the chain is not
// told its choice (structured output checks it against a grammar first).
llama_token sample_logits(llama_sampler * chain, const ChainShape & shape, const LogitRow & row,
                          std::vector<llama_token_data> & cur, bool accept = true);

// The order llama.cpp's greedy and top-k samplers rank candidates in: larger logit first,
// then lower id.
bool better(const llama_token_data & a, const llama_token_data & b);

// Runs `chain` over the candidates `cur` (best first when `sorted`) and returns its choice,
// accepted into the chain when `accept`; throws Error when the chain selects none.
llama_token apply_chain(llama_sampler * chain, std::vector<llama_token_data> & cur, bool sorted, bool accept = true);

// The k best candidates of `row` (k > 0), best first: larger logit, then lower id, as
// llama.cpp's greedy and top-k samplers rank them; all of them when the row has fewer.
// Found from the row's block maxima without ranking the whole row. False for a row of
// NaNs only, with its first k candidates in row order instead.
bool best_candidates(const LogitRow & row, size_t k, std::vector<llama_token_data> & cur);

// Whether sample_logits reads every logit of `row` with a chain of shape `shape` in a first
// pass (the row's block maxima) that choose_split can spread over threads: a whole row of
// a large vocabulary, and a greedy chain or one that starts with top-k, without penalties.
bool splits(const ChainShape & shape, const LogitRow & row);

// Calls pick(i) for every row i of `rows` (every one of them splits()) on `pool`, once the
// row's block maxima are in: the first pass over each row is cut into parts of a few
// dozen kilobytes, the parts of all rows spread over the pool, and the item that finishes
// a row's last part runs pick for it, with rows[i].maxima set (kept in `buffer`). A row a
// GPU has just copied out is read from memory, which is most of choosing a token from it,
// and one core reads only part of what the memory can give: split over a few, that pass
// takes a fraction of its time. pick(i) runs once for each row, on any of the pool's
// threads, as in TaskPool::run, whose exceptions it passes on.
void choose_split(TaskPool & pool, std::vector<LogitRow> & rows, std::vector<float> & buffer,
                  const std::function<void(size_t)> & pick);

// log softmax(logits)[token], over the whole vocabulary.
float token_logprob(const float * logits, int32_t n_vocab, llama_token token);
// Scoring a prompt token: log softmax(logits)[token] as llama-perplexity computes it (float
// exponentials summed in double), so that perplexities agree with llama.cpp's; `greedy`:
// the token is the row's first maximum (an argmax), as evaluation harnesses check.
void score_token(const float * logits, int32_t n_vocab, llama_token token, float & logprob, bool & greedy);
// The k most likely tokens of a row of raw logits with their log-probabilities (log softmax
// of the whole row, as token_logprob), most likely first; equal logits: lower id first.
void top_logprobs(const float * logits, int32_t n_vocab, int32_t k, std::vector<std::pair<llama_token, float>> & out);

// The seed every prompt of a call uses: params.seed, or one random draw when it is -1.
uint32_t resolve_seed(const GenerateParams & params);

}  // namespace fastpar
