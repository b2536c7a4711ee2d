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
// the sampler's own state, so it is an upper bound). Then the typical chain alone on 40
// sorted candidates. Medians, in microseconds a token.
//
// Last, 1, 2 and 4 rows at once, as host sampling below 8 slots chooses them when the
// output is on a GPU: one after another on this thread, and split (choose_split: each
// row's first pass in parts on a pool with the options a Context's pool has then, every
// CPU but this one a worker), each row evicted before every step and the steps 20 ms apart
// (a steady pace, as generation steps come, which the pool's workers anticipate). Medians
// in microseconds a step, and whether both ways chose the same tokens.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <thread>
#include <vector>

#include "core/base/params.hpp"
#include "core/threads/pool.hpp"
#include "core/sampling/sampling.hpp"
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

// Writes over every cache line of `buffer` (64 MB), which evicts a row from the caches.
void evict_caches(std::vector<char> & buffer) {
    for (size_t b = 0; b < buffer.size(); b += 64) {
        buffer[b] = static_cast<char>(buffer[b] + 1);
    }
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
        const fastpar::ChainShape shape = fastpar::ChainShape::of(p);
        fastpar::SamplerPtr chain = fastpar::make_sampler(p, 42, n_vocab);
        std::vector<llama_token_data> cur;
        for (const bool cold : {false, true}) {
            std::vector<double> us;
            for (int i = 0; i < iterations; ++i) {
                if (cold) {
                    evict_caches(evict);
                }
                const double t0 = now_us();
                const llama_token token = fastpar::sample_logits(chain.get(), shape, fastpar::LogitRow{row.data(), n_vocab}, cur);
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

    const int threads = static_cast<int>(std::max(2u, std::thread::hardware_concurrency()));
    fastpar::TaskPool pool(threads - 1, fastpar::TaskPool::Options::for_gpu_output());
    const int steps = std::min(iterations, 100);
    std::printf("rows at once, cold, a step every 20 ms, %d steps, pool of %d threads: us a step\n", steps, threads);
    bool all_same = true;
    for (const size_t n_rows : {1, 2, 4}) {
        std::vector<std::vector<float>> copies(n_rows, row);
        for (const bool typical : {false, true}) {
            const GenerateParams p = chain_params(typical);
            const fastpar::ChainShape shape = fastpar::ChainShape::of(p);
            double results[2];
            std::vector<llama_token> chosen[2];
            for (const bool split : {false, true}) {
                std::vector<fastpar::SamplerPtr> chains;
                for (size_t r = 0; r < n_rows; ++r) {
                    chains.push_back(fastpar::make_sampler(p, 42, n_vocab));
                }
                std::vector<float> buffer;
                std::vector<double> step_us;
                double due = now_us();
                for (int i = 0; i < steps; ++i) {
                    evict_caches(evict);
                    due += 20000.0;
                    while (now_us() < due) {
                    }
                    std::vector<fastpar::LogitRow> rows;
                    for (auto & c : copies) {
                        rows.push_back(fastpar::LogitRow{c.data(), n_vocab});
                    }
                    std::vector<llama_token> tokens(n_rows);
                    const auto pick = [&](size_t r) {
                        thread_local std::vector<llama_token_data> cur;
                        tokens[r] = fastpar::sample_logits(chains[r].get(), shape, rows[r], cur);
                    };
                    const double t0 = now_us();
                    if (split) {
                        fastpar::choose_split(pool, rows, buffer, pick);
                    } else {
                        for (size_t r = 0; r < n_rows; ++r) {
                            pick(r);
                        }
                    }
                    step_us.push_back(now_us() - t0);
                    chosen[split].insert(chosen[split].end(), tokens.begin(), tokens.end());
                }
                results[split] = median(step_us);
            }
            std::printf("%zu row%s %-8s one thread %8.1f   split %8.1f   same tokens: %s\n", n_rows,
                        n_rows == 1 ? " " : "s", typical ? "typical" : "greedy", results[0], results[1],
                        chosen[0] == chosen[1] ? "yes" : "NO");
            all_same = all_same && chosen[0] == chosen[1];
        }
    }
    return all_same ? 0 : 1;
}
