// A generation step of raw llama.cpp calls, the way fastpar makes them, with and without
// reading the logits on the host between steps.
//
//   cmake --build <build dir> --target fastpar-decode-steps     (FASTPAR_BUILD_BASELINES=ON)
//   <build dir>/fastpar-decode-steps <model.gguf> [slots,...] [runs] [n_gpu_layers] [ways] [embeddings]
//
// For each number of slots: one context as a fastpar Context makes it (n_ctx = slots x 90,
// n_batch = n_ubatch = 512, one sequence a slot, KV cache not unified, as many threads as
// CPUs), then `runs` runs of the GPU table's workload: 32 random prompt tokens a slot (in
// decodes of up to 512 tokens), then 50 steps of one token a slot with every row's logits
// out, each step llama_decode + llama_synchronize (as llama-batched-bench and fastpar both
// do). Ways of spending the time between steps, each run twice, in turn:
//   none    feed the next token without looking at the logits (llama-batched-bench)
//   read    llama_get_logits_ith for every row and an argmax of it on this thread (whole
//           rows chosen on the host, as fastpar's host sampling does, on one thread)
//   touch   read every row's logits without choosing (the memory traffic alone)
//   pool-greedy, pool-typical
//           every row chosen by fastpar's own host sampling (sample_logits, the chain
//           make_sampler builds: greedy, or the GPU table's typical sampler) on fastpar's
//           TaskPool with one worker a CPU but the caller's, as a Context does from 8 rows
//   calling-greedy, calling-typical
//           the same choosing, all on the calling thread (no pool)
//   spin-greedy, spin-typical
//           on a pool whose caller polls up to 500 us for the workers' last rows before
//           it sleeps
//   p4-greedy, p4-typical
//           on a pool of 3 workers and the caller (fewer cores busy between the steps)
//   ant-greedy, ant-typical
//           on a pool with the options a Context uses when the output layer is on a GPU
//           (workers waking ahead of the next step's sampling and polling for it, the
//           caller polling for their last rows: TaskPool::Options::for_gpu_output)
//   split-greedy, split-typical
//           on that pool, each row's first pass cut into parts over its threads
//           (choose_split), as a Context chooses fewer than 8 whole rows from a GPU; the
//           calling-* ways are what it did before
// `ways` (a comma-separated list of the names above, or "all") runs only those.
// `embeddings`: "host" (default) leaves the token-embedding table where llama.cpp puts it
// (host memory); "gpu" puts it on the first GPU, as a fastpar Model does for a quantized
// table with every layer offloaded (model.cpp), to measure what that placement costs a step.
// Printed: the median over runs (the first left out) of a step's decode + synchronise time,
// ms, and of the time between steps.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/base/params.hpp"
#include "core/threads/pool.hpp"
#include "core/sampling/sampling.hpp"
#include "core/loop/scheduler.hpp"  // batch_add
#include "llama.h"
#include "tool_common.hpp"

namespace {

double now_ms() { return fastpar_bench::now_us() / 1000.0; }

}  // namespace

int main(int argc, char ** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: %s model.gguf [slots,...] [runs] [n_gpu_layers] [ways]\n", argv[0]);
        return 2;
    }
    const std::vector<int64_t> slot_counts = fastpar_bench::int_list(argc > 2 ? argv[2] : "1,8,32");
    const int runs = argc > 3 ? std::max(2, std::atoi(argv[3])) : 4;
    const int n_gpu_layers = argc > 4 ? std::atoi(argv[4]) : 999;
    const std::string only = argc > 5 && std::string(argv[5]) != "all" ? "," + std::string(argv[5]) + "," : "";
    const std::string embeddings = argc > 6 ? argv[6] : "host";
    if (embeddings != "host" && embeddings != "gpu") {
        std::fprintf(stderr, "embeddings must be host or gpu, not '%s'\n", embeddings.c_str());
        return 2;
    }
    const int kPrompt = 32, kGen = 50;

    llama_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = n_gpu_layers;
    llama_model_tensor_buft_override overrides[2] = {{nullptr, nullptr}, {nullptr, nullptr}};
    if (embeddings == "gpu") {
        ggml_backend_dev_t gpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_GPU);
        if (gpu == nullptr) {
            std::fprintf(stderr, "embeddings=gpu, but this build has no GPU device\n");
            return 2;
        }
        overrides[0] = {"^token_embd\\.weight$", ggml_backend_dev_buffer_type(gpu)};
        mp.tensor_buft_overrides = overrides;
    }
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (model == nullptr) {
        std::fprintf(stderr, "could not load %s\n", argv[1]);
        return 1;
    }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);
    const int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    std::printf("%s, %d threads, %d runs a way (first left out), token embeddings on the %s, ms\n", argv[1],
                threads, runs, embeddings == "gpu" ? "GPU" : "host (llama.cpp's placement)");
    std::printf("%6s %16s %12s %12s\n", "slots", "way", "step", "between");

    std::mt19937 rng(1);
    fastpar::TaskPool pool(threads - 1);
    fastpar::TaskPool::Options spin_options;
    spin_options.caller_spin_us = 500;
    fastpar::TaskPool spin_pool(threads - 1, spin_options);
    fastpar::TaskPool p4_pool(std::min(3, threads - 1));
    fastpar::TaskPool ant_pool(threads - 1, fastpar::TaskPool::Options::for_gpu_output());
    fastpar::GenerateParams greedy, typical;
    greedy.temperature = 0.0f;
    typical.temperature = 0.8f;
    typical.top_k = 40;
    typical.top_p = 0.95f;
    typical.min_p = 0.0f;
    for (const int64_t n64 : slot_counts) {
        const int n = static_cast<int>(n64);
        llama_context_params cp = llama_context_default_params();
        cp.n_ctx = static_cast<uint32_t>(n * 90);
        cp.n_batch = 512;
        cp.n_ubatch = 512;
        cp.n_seq_max = static_cast<uint32_t>(n);
        cp.n_threads = threads;
        cp.n_threads_batch = threads;
        cp.kv_unified = false;
        cp.no_perf = true;
        llama_context * ctx = llama_init_from_model(model, cp);
        if (ctx == nullptr) {
            std::fprintf(stderr, "could not make a context for %d slots\n", n);
            return 1;
        }
        llama_batch batch = llama_batch_init(512, 0, 1);
        llama_memory_t mem = llama_get_memory(ctx);
        const char * ways[] = {"none",         "read",         "touch",           "pool-greedy",
                               "calling-greedy", "spin-greedy", "p4-greedy",     "ant-greedy",
                               "pool-typical", "calling-typical", "spin-typical", "p4-typical",
                               "ant-typical",  "split-greedy", "split-typical"};
        for (int round = 0; round < 2; ++round)
        for (const char * way : ways) {
            const std::string w = way;
            if (!only.empty() && only.find("," + w + ",") == std::string::npos) {
                continue;
            }
            fastpar::TaskPool * way_pool = w.rfind("pool-", 0) == 0   ? &pool
                                           : w.rfind("spin-", 0) == 0 ? &spin_pool
                                           : w.rfind("p4-", 0) == 0   ? &p4_pool
                                           : w.rfind("ant-", 0) == 0  ? &ant_pool
                                           : w.rfind("split-", 0) == 0 ? &ant_pool
                                                                       : nullptr;
            const bool fastpar_way = way_pool != nullptr || w.rfind("calling-", 0) == 0;
            const fastpar::GenerateParams & params = w.find("typical") != std::string::npos ? typical : greedy;
            const fastpar::ChainShape shape = fastpar::ChainShape::of(params);
            std::vector<fastpar::SamplerPtr> chains;
            for (int s = 0; s < n; ++s) {
                chains.push_back(fastpar::make_sampler(params, 42, n_vocab));
            }
            std::vector<fastpar::LogitRow> rows(static_cast<size_t>(n));
            std::vector<float> split_buffer;
            std::vector<double> steps, between;
            for (int r = 0; r < runs; ++r) {
                llama_memory_clear(mem, false);
                // The prompts, in decodes of at most n_batch tokens (as fastpar plans them).
                batch.n_tokens = 0;
                for (int s = 0; s < n; ++s) {
                    for (int i = 0; i < kPrompt; ++i) {
                        fastpar::batch_add(batch, static_cast<llama_token>(rng() % n_vocab), i, s, i == kPrompt - 1);
                        const bool last = s == n - 1 && i == kPrompt - 1;
                        if (batch.n_tokens == static_cast<int32_t>(cp.n_batch) || (last && batch.n_tokens > 0)) {
                            if (llama_decode(ctx, batch) != 0) {
                                std::fprintf(stderr, "prompt decode failed\n");
                                return 1;
                            }
                            batch.n_tokens = 0;
                        }
                    }
                }
                llama_synchronize(ctx);
                std::vector<llama_token> next(static_cast<size_t>(n), 0);
                double t_end = now_ms();
                volatile float sink = 0.0f;
                for (int step = 0; step < kGen; ++step) {
                    // Between steps: what the caller does with the last step's logits (the
                    // first step feeds random tokens: the prompts' rows may lie in
                    // several decodes).
                    if (step == 0 || w == "none") {
                        for (auto & t : next) {
                            t = static_cast<llama_token>(rng() % n_vocab);
                        }
                    } else {
                        // As Scheduler::sample: rows found on this thread, chosen anywhere.
                        for (int s = 0; s < n; ++s) {
                            rows[static_cast<size_t>(s)] = fastpar::LogitRow{llama_get_logits_ith(ctx, s), n_vocab};
                            if (rows[static_cast<size_t>(s)].logits == nullptr) {
                                std::fprintf(stderr, "no logits for sequence %d\n", s);
                                return 1;
                            }
                        }
                        const auto pick = [&](size_t i) {
                            thread_local std::vector<llama_token_data> cur;
                            next[i] = fastpar::sample_logits(chains[i].get(), shape, rows[i], cur);
                        };
                        if (w.rfind("split-", 0) == 0) {
                            fastpar::choose_split(*way_pool, rows, split_buffer, pick);
                        } else if (way_pool != nullptr) {
                            way_pool->run(static_cast<size_t>(n), pick);
                        } else if (fastpar_way) {
                            for (size_t i = 0; i < static_cast<size_t>(n); ++i) {
                                pick(i);
                            }
                        } else {
                            for (size_t i = 0; i < static_cast<size_t>(n); ++i) {
                                const float * row = rows[i].logits;
                                if (w == "read") {
                                    next[i] = static_cast<llama_token>(std::max_element(row, row + n_vocab) - row);
                                } else {
                                    float acc = 0.0f;
                                    for (int t = 0; t < n_vocab; t += 16) {
                                        acc += row[t];
                                    }
                                    sink = sink + acc;
                                }
                            }
                        }
                    }
                    batch.n_tokens = 0;
                    for (int s = 0; s < n; ++s) {
                        fastpar::batch_add(batch, next[static_cast<size_t>(s)], kPrompt + step, s, true);
                    }
                    const double t0 = now_ms();
                    if (r > 0 && step > 0) {
                        between.push_back(t0 - t_end);
                    }
                    if (llama_decode(ctx, batch) != 0) {
                        std::fprintf(stderr, "decode failed\n");
                        return 1;
                    }
                    llama_synchronize(ctx);
                    t_end = now_ms();
                    if (r > 0) {
                        steps.push_back(t_end - t0);
                    }
                }
            }
            std::printf("%6d %16s %12.3f %12.3f\n", n, way, fastpar_bench::median(steps), fastpar_bench::median(between));
            std::fflush(stdout);
        }
        llama_batch_free(batch);
        llama_free(ctx);
    }
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
