// What a step that mixes prompt chunks with generated tokens costs in raw llama.cpp, pass by
// pass (issue 43: outputs of different lengths run at a fraction of a lockstep load's speed).
//
//   cmake --build <build dir> --target fastpar-mixed-passes     (FASTPAR_BUILD_BASELINES=ON)
//   <build dir>/fastpar-mixed-passes <model.gguf> [slots] [reps] [n_gpu_layers] [chunk] [context]
//
// One context as a fastpar Context makes it on a GPU (one KV buffer a slot, n_ctx_per_seq
// 512, n_batch = n_ubatch = 2048), every slot holding `context` random tokens (default 96).
// With one KV buffer a slot, llama.cpp runs a batch as forward passes of an equal number of
// tokens a sequence, each over consecutive sequences only (its attention reads one view over
// their buffers). Each kind of step below is decoded `reps` times (after 2 warm-ups) and its
// tokens removed again, so every repetition sees the same cache (and llama.cpp reuses the
// step's graph, as it cannot when a load's steps differ); printed: the median ms of llama_decode + llama_synchronize, and the passes
// llama.cpp makes of it. "gen": every slot one token with logits; "+ K chunks": K slots
// add a prompt chunk of `chunk` tokens (no logits) instead, spread over the slots
// ("scattered", as refilled slots are) or side by side ("adjacent", equal or different
// lengths); "alone": the chunks without the generating slots; "taking turns": two steps of
// the same shape over other sequences, alternately, so that llama.cpp cannot reuse the last
// step's graph (what a load whose slots refill at different times pays every step). Last,
// "gen, advancing": generation steps that keep their tokens, as a steady lockstep load makes them.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/loop/scheduler.hpp"  // batch_add
#include "llama.h"
#include "tool_common.hpp"

namespace {

struct Add {
    int slot;
    int n;
    bool logits;
};

// llama.cpp's split of a batch without a unified cache (split_equal, sequential): a run of
// consecutive sequences a pass, as many tokens a sequence as the one in it with the fewest left.
int passes(std::vector<Add> adds) {
    int n = 0;
    while (!adds.empty()) {
        ++n;
        size_t end = 1;
        while (end < adds.size() && adds[end].slot == adds[end - 1].slot + 1) {
            ++end;
        }
        int least = adds[0].n;
        for (size_t i = 0; i < end; ++i) {
            least = std::min(least, adds[i].n);
        }
        std::vector<Add> rest;
        for (size_t i = 0; i < adds.size(); ++i) {
            const int left = i < end ? adds[i].n - least : adds[i].n;
            if (left > 0) {
                rest.push_back({adds[i].slot, left, adds[i].logits});
            }
        }
        adds = rest;
    }
    return n;
}

}  // namespace

int main(int argc, char ** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: %s model.gguf [slots] [reps] [n_gpu_layers] [chunk] [context]\n", argv[0]);
        return 2;
    }
    const int n_slots = argc > 2 ? std::atoi(argv[2]) : 256;
    const int reps = argc > 3 ? std::max(3, std::atoi(argv[3])) : 20;
    const int n_gpu_layers = argc > 4 ? std::atoi(argv[4]) : 999;
    const int chunk = argc > 5 ? std::max(1, std::atoi(argv[5])) : 32;
    const int context = argc > 6 ? std::max(1, std::atoi(argv[6])) : 96;
    const int n_ctx_per_seq = 512, n_batch = 2048;
    if (context + reps + 2 + chunk + 16 > n_ctx_per_seq || n_slots + 16 * chunk > n_batch || n_slots < 32) {
        std::fprintf(stderr, "context, reps, chunk or slots too large for %d cells a slot and %d-token batches, "
                     "or fewer than 32 slots (16 chunks side by side in the upper half)\n", n_ctx_per_seq, n_batch);
        return 2;
    }

    llama_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = n_gpu_layers;
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (model == nullptr) {
        std::fprintf(stderr, "could not load %s\n", argv[1]);
        return 1;
    }
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = static_cast<uint32_t>(n_slots * n_ctx_per_seq);
    cp.n_batch = cp.n_ubatch = n_batch;
    cp.n_seq_max = static_cast<uint32_t>(n_slots);
    cp.n_threads = cp.n_threads_batch = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    cp.kv_unified = false;
    cp.no_perf = true;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (ctx == nullptr) {
        std::fprintf(stderr, "could not make a context for %d slots\n", n_slots);
        return 1;
    }
    llama_memory_t mem = llama_get_memory(ctx);
    llama_batch batch = llama_batch_init(n_batch, 0, 1);
    std::mt19937 rng(1);
    std::vector<llama_pos> pos(static_cast<size_t>(n_slots), 0);

    auto decode = [&](const std::vector<Add> & adds) {
        batch.n_tokens = 0;
        for (const Add & a : adds) {
            for (int i = 0; i < a.n; ++i) {
                fastpar::batch_add(batch, static_cast<llama_token>(rng() % n_vocab), pos[a.slot] + i, a.slot,
                                   a.logits && i == 0);
            }
        }
        const double t0 = fastpar_bench::now_us();
        if (llama_decode(ctx, batch) != 0) {
            std::fprintf(stderr, "decode failed\n");
            std::exit(1);
        }
        llama_synchronize(ctx);
        return (fastpar_bench::now_us() - t0) / 1000.0;
    };
    // Every slot's context, in batches of whole slots.
    for (int s = 0; s < n_slots;) {
        std::vector<Add> adds;
        for (; s < n_slots && static_cast<int>(adds.size() + 1) * context <= n_batch; ++s) {
            adds.push_back({s, context, false});
        }
        decode(adds);
        for (const Add & a : adds) {
            pos[a.slot] += a.n;
        }
    }

    auto gen_with = [&](const std::vector<int> & slots, const std::vector<int> & lengths, bool gen) {
        std::vector<Add> adds;
        for (int s = 0; s < n_slots; ++s) {
            const auto it = std::find(slots.begin(), slots.end(), s);
            if (it != slots.end()) {
                adds.push_back({s, lengths[static_cast<size_t>(it - slots.begin())], false});
            } else if (gen) {
                adds.push_back({s, 1, true});
            }
        }
        return adds;
    };
    auto scattered = [&](int k) {
        std::vector<int> v;
        for (int i = 0; i < k; ++i) {
            v.push_back(i * n_slots / k + n_slots / (2 * k));
        }
        return v;
    };
    auto adjacent = [&](int k) {
        std::vector<int> v;
        for (int i = 0; i < k; ++i) {
            v.push_back(n_slots / 2 + i);
        }
        return v;
    };
    auto same = [&](int k) { return std::vector<int>(static_cast<size_t>(k), chunk); };
    auto rising = [&](int k) {
        std::vector<int> v;
        for (int i = 0; i < k; ++i) {
            v.push_back(chunk + i);
        }
        return v;
    };

    // A kind is one step, or steps that take turns (their sequences differ, so llama.cpp
    // cannot reuse the last step's graph, as in a load whose slots refill at different times).
    std::vector<std::pair<std::string, std::vector<std::vector<Add>>>> kinds = {
        {"gen", {gen_with({}, {}, true)}},
    };
    for (int k : {1, 2, 4, 8, 16}) {
        kinds.push_back({"gen + " + std::to_string(k) + " chunks, scattered", {gen_with(scattered(k), same(k), true)}});
    }
    kinds.push_back({"gen + 4 chunks, adjacent", {gen_with(adjacent(4), same(4), true)}});
    kinds.push_back({"gen + 4 chunks, adjacent, lengths differ", {gen_with(adjacent(4), rising(4), true)}});
    kinds.push_back({"gen + 16 chunks, adjacent", {gen_with(adjacent(16), same(16), true)}});
    kinds.push_back({"1 chunk alone", {gen_with(scattered(1), same(1), false)}});
    kinds.push_back({"4 chunks alone, scattered", {gen_with(scattered(4), same(4), false)}});
    kinds.push_back({"4 chunks alone, adjacent", {gen_with(adjacent(4), same(4), false)}});
    kinds.push_back({"16 chunks alone, adjacent", {gen_with(adjacent(16), same(16), false)}});
    {
        // All slots but the last, then all but the first: one pass each, other sequences.
        std::vector<Add> all = gen_with({}, {}, true);
        kinds.push_back({"gen less one slot, taking turns", {std::vector<Add>(all.begin(), all.end() - 1),
                                                              std::vector<Add>(all.begin() + 1, all.end())}});
        std::vector<int> shifted = scattered(4);
        for (int & s : shifted) {
            s += 1;
        }
        kinds.push_back({"gen + 4 chunks, scattered, taking turns",
                         {gen_with(scattered(4), same(4), true), gen_with(shifted, same(4), true)}});
    }

    std::printf("%s: %d slots, %d tokens of context each, chunks of %d tokens, median of %d, ms\n", argv[1], n_slots,
                context, chunk, reps);
    std::printf("%-44s %7s %7s %9s\n", "step", "tokens", "passes", "ms");
    for (const auto & [name, variants] : kinds) {
        std::vector<double> ms;
        int n_tokens = 0;
        for (const Add & a : variants[0]) {
            n_tokens += a.n;
        }
        for (int r = 0; r < reps + 2; ++r) {
            const std::vector<Add> & adds = variants[static_cast<size_t>(r) % variants.size()];
            const double t = decode(adds);
            for (const Add & a : adds) {
                llama_memory_seq_rm(mem, a.slot, pos[a.slot], -1);
            }
            if (r >= 2) {
                ms.push_back(t);
            }
        }
        std::printf("%-44s %7d %7d %9.2f\n", name.c_str(), n_tokens, passes(variants[0]), fastpar_bench::median(ms));
    }
    {
        const std::vector<Add> adds = gen_with({}, {}, true);
        std::vector<double> ms;
        for (int r = 0; r < reps + 2; ++r) {
            const double t = decode(adds);
            for (const Add & a : adds) {
                pos[a.slot] += 1;
            }
            if (r >= 2) {
                ms.push_back(t);
            }
        }
        std::printf("%-44s %7d %7d %9.2f\n", "gen, advancing", n_slots, 1, fastpar_bench::median(ms));
    }
    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
