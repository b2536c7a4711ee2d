// What choosing one token from a whole row of logits costs on the host: fastpar's
// sample_logits (sampling.cpp) on one row, as host sampling with one slot does each step.
//
//   cmake --build <build dir> --target fastpar-choose-row     (FASTPAR_BUILD_BASELINES=ON)
//   <build dir>/fastpar-choose-row [n_vocab] [iterations]
//
// A row of n_vocab (default 151,936, Qwen's) random logits; greedy (an argmax) and the
// typical chain (temperature 0.8, top-k 40, top-p 0.95): the k best found in one pass,
// then llama.cpp's chain over them. Each is timed with the row in the caches ("warm": the
// same row again) and after a 64 MB buffer has been written over, which evicts it ("cold":
// as a row the GPU has just copied into host memory arrives; this also evicts the code and
// the sampler's own state, so it is an upper bound). Last, the typical chain alone on 40
// sorted candidates. Medians, in microseconds a token.
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "core/params.hpp"
#include "core/sampling.hpp"
#include "tool_common.hpp"

using fastpar::GenerateParams;
using fastpar_bench::median;
using fastpar_bench::now_us;

// The greedy chain, or the typical one (temperature 0.8, top-k 40, top-p 0.95).
GenerateParams chain_params(bool typical) {
    GenerateParams p;
    p.temperature = typical ? 0.8f : 0.0f;
    p.top_k = typical ? 40 : 0;
    p.top_p = typical ? 0.95f : 1.0f;
    p.min_p = 0.0f;
    return p;
}

int main(int argc, char ** argv) {
    const int32_t n_vocab = argc > 1 ? std::atoi(argv[1]) : 151936;
    const int iterations = argc > 2 ? std::atoi(argv[2]) : 200;
    if (n_vocab < 64 || iterations < 1) {
        std::fprintf(stderr, "usage: %s [n_vocab >= 64] [iterations >= 1]\n", argv[0]);
        return 1;
    }
    std::vector<float> row(static_cast<size_t>(n_vocab));
    std::mt19937 rng(1);
    std::normal_distribution<float> logit(0.0f, 3.0f);
    for (float & x : row) {
        x = logit(rng);
    }
    std::vector<char> evict(64u << 20);
    std::printf("n_vocab %d, %d tokens each, median us a token\n", n_vocab, iterations);
    for (const bool typical : {false, true}) {
        const GenerateParams p = chain_params(typical);
        fastpar::SamplerPtr chain = fastpar::make_sampler(p, 42, n_vocab);
        std::vector<llama_token_data> cur;
        for (const bool cold : {false, true}) {
            std::vector<double> us;
            for (int i = 0; i < iterations; ++i) {
                if (cold) {
                    for (size_t b = 0; b < evict.size(); b += 64) {
                        evict[b] = static_cast<char>(evict[b] + 1);
                    }
                }
                const double t0 = now_us();
                const llama_token token = fastpar::sample_logits(chain.get(), p, fastpar::LogitRow{row.data(), n_vocab}, cur);
                us.push_back(now_us() - t0);
                if (token < 0 || token >= n_vocab) {
                    std::fprintf(stderr, "no token chosen\n");
                    return 1;
                }
            }
            std::printf("%-8s %-5s %8.1f\n", typical ? "typical" : "greedy", cold ? "cold" : "warm", median(us));
        }
    }
    // The chain alone (what is left of choosing once the k best are found).
    fastpar::SamplerPtr chain = fastpar::make_sampler(chain_params(true), 42, n_vocab);
    std::vector<double> us;
    for (int i = 0; i < iterations; ++i) {
        std::vector<llama_token_data> cur;
        for (int32_t t = 0; t < 40; ++t) {
            cur.push_back(llama_token_data{t, 10.0f - 0.1f * static_cast<float>(t), 0.0f});
        }
        const double t0 = now_us();
        llama_token_data_array candidates = {cur.data(), cur.size(), -1, true};
        llama_sampler_apply(chain.get(), &candidates);
        llama_sampler_accept(chain.get(), cur[static_cast<size_t>(candidates.selected)].id);
        us.push_back(now_us() - t0);
    }
    std::printf("%-14s %8.2f\n", "chain on 40", median(us));
    return 0;
}
