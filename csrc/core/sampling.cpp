#include "core/sampling.hpp"

#include <algorithm>
#include <cmath>
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

namespace {

// Whether make_sampler puts a penalties sampler first (it needs the token history).
bool has_penalties(const GenerateParams & p) {
    return p.repeat_penalty != 1.0f || p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f;
}

}  // namespace

bool same_sampler(const GenerateParams & a, uint32_t seed_a, const GenerateParams & b, uint32_t seed_b) {
    const bool greedy = a.temperature <= 0.0f;
    return greedy == (b.temperature <= 0.0f) && a.repeat_penalty == b.repeat_penalty &&
           a.frequency_penalty == b.frequency_penalty && a.presence_penalty == b.presence_penalty &&
           a.repeat_last_n == b.repeat_last_n &&
           (greedy || (a.temperature == b.temperature && a.top_k == b.top_k && a.top_p == b.top_p &&
                       a.min_p == b.min_p && seed_a == seed_b));
}

llama_token sample_logits(llama_sampler * chain, const GenerateParams & p, const float * logits,
                          int32_t n_vocab, std::vector<llama_token_data> & cur) {
    const bool penalties = has_penalties(p);
    if (!penalties && p.temperature <= 0.0f) {
        // The greedy sampler's choice: the first of the largest logits.
        llama_token best = 0;
        for (llama_token t = 1; t < n_vocab; ++t) {
            if (logits[t] > logits[best]) {
                best = t;
            }
        }
        llama_sampler_accept(chain, best);
        return best;
    }
    bool sorted = false;
    if (!penalties && p.top_k > 0 && p.top_k < n_vocab) {
        // The k largest logits (a min-heap of k in one pass), best first: what the chain's
        // top-k sampler would keep, so it and the rest of the chain see the same candidates.
        const auto k = static_cast<size_t>(p.top_k);
        const auto worse = [](const llama_token_data & a, const llama_token_data & b) {
            return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
        };
        cur.clear();
        for (llama_token t = 0; t < n_vocab; ++t) {
            if (cur.size() < k) {
                cur.push_back(llama_token_data{t, logits[t], 0.0f});
                std::push_heap(cur.begin(), cur.end(), worse);
            } else if (logits[t] > cur.front().logit) {
                std::pop_heap(cur.begin(), cur.end(), worse);
                cur.back() = llama_token_data{t, logits[t], 0.0f};
                std::push_heap(cur.begin(), cur.end(), worse);
            }
        }
        std::sort_heap(cur.begin(), cur.end(), worse);
        sorted = true;
    } else {
        cur.resize(static_cast<size_t>(n_vocab));
        for (llama_token t = 0; t < n_vocab; ++t) {
            cur[static_cast<size_t>(t)] = llama_token_data{t, logits[t], 0.0f};
        }
    }
    llama_token_data_array cur_p = {cur.data(), cur.size(), -1, sorted};
    llama_sampler_apply(chain, &cur_p);
    if (cur_p.selected < 0 || cur_p.selected >= static_cast<int64_t>(cur_p.size)) {
        throw Error("the sampler chain selected no token");
    }
    const llama_token token = cur_p.data[cur_p.selected].id;
    llama_sampler_accept(chain, token);
    return token;
}

float token_logprob(const float * logits, int32_t n_vocab, llama_token token) {
    float max = logits[0];
    for (int32_t i = 1; i < n_vocab; ++i) {
        max = std::max(max, logits[i]);
    }
    double sum = 0.0;
    for (int32_t i = 0; i < n_vocab; ++i) {
        sum += std::exp(static_cast<double>(logits[i] - max));
    }
    return static_cast<float>(static_cast<double>(logits[token] - max) - std::log(sum));
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
    if (has_penalties(p)) {
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
