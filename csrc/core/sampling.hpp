// Per-prompt sampler chains built from GenerateParams with llama.h's sampler API.
#pragma once

#include <cstdint>
#include <memory>

#include "core/params.hpp"
#include "llama.h"

namespace fastpar {

struct SamplerDeleter {
    void operator()(llama_sampler * s) const { llama_sampler_free(s); }
};
using SamplerPtr = std::unique_ptr<llama_sampler, SamplerDeleter>;

// penalties -> (greedy | top_k -> top_p -> min_p -> temperature -> dist(seed)).
// `seed` is the resolved seed (never -1).
SamplerPtr make_sampler(const GenerateParams & params, uint32_t seed, int32_t n_vocab);

// The seed every prompt of a call uses: params.seed, or one random draw when it is -1.
uint32_t resolve_seed(const GenerateParams & params);

}  // namespace fastpar
