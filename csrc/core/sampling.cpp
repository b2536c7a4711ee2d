#include "core/sampling.hpp"

#include <random>

#include "core/errors.hpp"

namespace fastpar {

uint32_t resolve_seed(const GenerateParams & params) {
    if (params.seed >= 0) {
        return static_cast<uint32_t>(params.seed);
    }
    std::random_device rd;
    return rd();
}

SamplerPtr make_sampler(const GenerateParams & p, uint32_t seed, int32_t n_vocab) {
    llama_sampler_chain_params cp = llama_sampler_chain_default_params();
    cp.no_perf = true;
    SamplerPtr chain(llama_sampler_chain_init(cp));
    if (!chain) {
        throw Error("could not create a sampler chain");
    }
    auto add = [&](llama_sampler * s) {
        if (s == nullptr) {
            throw Error("could not create a sampler");
        }
        llama_sampler_chain_add(chain.get(), s);  // the chain owns it from here
    };
    if (p.repeat_penalty != 1.0f || p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f) {
        add(llama_sampler_init_penalties(n_vocab, p.repeat_last_n, p.repeat_penalty, p.frequency_penalty,
                                         p.presence_penalty));
    }
    if (p.temperature <= 0.0f) {
        add(llama_sampler_init_greedy());
        return chain;
    }
    if (p.top_k > 0) {
        add(llama_sampler_init_top_k(p.top_k));
    }
    if (p.top_p < 1.0f) {
        add(llama_sampler_init_top_p(p.top_p, 1));
    }
    if (p.min_p > 0.0f) {
        add(llama_sampler_init_min_p(p.min_p, 1));
    }
    add(llama_sampler_init_temp(p.temperature));
    add(llama_sampler_init_dist(seed));
    return chain;
}

}  // namespace fastpar
