// What device sampling's graph ops cost on a backend, beside copying whole rows back.
//
//   cmake --build <build dir> --target fastpar-reducer-ops     (FASTPAR_BUILD_BASELINES=ON)
//   <build dir>/fastpar-reducer-ops [n_vocab] [rows,...] [iterations]
//
// For each number of rows, a tensor of [n_vocab, rows] random logits lives on the backend
// (the GPU if ggml has one, else the CPU), and each way of cutting rows down runs as its
// own ggml graph: computed, and its outputs copied to host memory (pinned where the
// backend offers it, as llama.cpp's output buffer is), `iterations` times after a
// warm-up; the median of 5 batches, in microseconds a step. `copy` is what raw llama.cpp
// and host sampling pay instead: every row copied back whole.
//
// Ways (device_sampling.hpp explains the first):
//   top_k       pool_1d max over blocks of 128 -> ggml_top_k 64 -> get_rows
//   argsort     the same with ggml_argsort_top_k (fastpar's)
//   pairs       pool_1d max over blocks of 256 (the last n_vocab % 256 left for a tail,
//               always copied) -> ggml_argsort_top_k 64 over <= 1024 maxima -> get_rows
//               of the 256-wide blocks, concatenated with the tail
//   pool        the first op alone (its maxima copied back)
//   pool2       the same maxima in two pooling ops, over 8 logits and then over 16 of
//               those maxima: more threads, each reading fewer logits in a row
//   argsort2    argsort's way with pool2's maxima
//   argmax      ggml_argmax of every row (what a greedy-only chain would need)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml.h"
#include "tool_common.hpp"

namespace {

struct Way {
    const char * name;
    // Adds the ops for `logits` ([n, rows]); returns the tensors to copy back.
    std::vector<ggml_tensor *> (*build)(ggml_context *, ggml_tensor *);
    // Token id of candidate j of a row, from the row's block indices (null: no candidates).
    int64_t (*id)(const int32_t * blocks, int64_t j, int64_t n);
};

constexpr int kTop = 64;

std::vector<ggml_tensor *> way_top_k(ggml_context * ctx, ggml_tensor * logits) {
    const int64_t n = logits->ne[0], rows = logits->ne[1];
    ggml_tensor * maxima = ggml_pool_1d(ctx, logits, GGML_OP_POOL_MAX, 128, 128, 0);
    ggml_tensor * blocks = ggml_top_k(ctx, maxima, kTop);
    ggml_tensor * values = ggml_get_rows(ctx, ggml_reshape_3d(ctx, logits, 128, n / 128, rows), blocks);
    return {blocks, values};
}

std::vector<ggml_tensor *> way_argsort(ggml_context * ctx, ggml_tensor * logits) {
    const int64_t n = logits->ne[0], rows = logits->ne[1];
    ggml_tensor * maxima = ggml_pool_1d(ctx, logits, GGML_OP_POOL_MAX, 128, 128, 0);
    ggml_tensor * blocks = ggml_cont(ctx, ggml_argsort_top_k(ctx, maxima, kTop));
    ggml_tensor * values = ggml_get_rows(ctx, ggml_reshape_3d(ctx, logits, 128, n / 128, rows), blocks);
    return {blocks, values};
}

std::vector<ggml_tensor *> way_pairs(ggml_context * ctx, ggml_tensor * logits) {
    const int64_t n = logits->ne[0], rows = logits->ne[1];
    const int64_t n_wide = n / 256, tail = n % 256;
    ggml_tensor * maxima = ggml_pool_1d(ctx, logits, GGML_OP_POOL_MAX, 256, 256, 0);  // [n_wide, rows]
    ggml_tensor * blocks = ggml_cont(ctx, ggml_argsort_top_k(ctx, maxima, kTop));
    ggml_tensor * wide = ggml_view_3d(ctx, logits, 256, n_wide, rows, 256 * sizeof(float), logits->nb[1], 0);
    ggml_tensor * values = ggml_reshape_2d(ctx, ggml_get_rows(ctx, wide, blocks), 256 * kTop, rows);
    if (tail > 0) {
        ggml_tensor * rest = ggml_view_2d(ctx, logits, tail, rows, logits->nb[1], n_wide * 256 * sizeof(float));
        values = ggml_concat(ctx, values, ggml_cont(ctx, rest), 0);
    }
    return {blocks, values};
}

std::vector<ggml_tensor *> way_pool(ggml_context * ctx, ggml_tensor * logits) {
    return {ggml_pool_1d(ctx, logits, GGML_OP_POOL_MAX, 128, 128, 0)};
}

// Maxima of 128-logit blocks, in two steps (8, then 16 of those).
ggml_tensor * maxima_in_two(ggml_context * ctx, ggml_tensor * logits) {
    ggml_tensor * m8 = ggml_pool_1d(ctx, logits, GGML_OP_POOL_MAX, 8, 8, 0);
    return ggml_pool_1d(ctx, m8, GGML_OP_POOL_MAX, 16, 16, 0);
}

std::vector<ggml_tensor *> way_pool2(ggml_context * ctx, ggml_tensor * logits) { return {maxima_in_two(ctx, logits)}; }

std::vector<ggml_tensor *> way_argsort2(ggml_context * ctx, ggml_tensor * logits) {
    const int64_t n = logits->ne[0], rows = logits->ne[1];
    ggml_tensor * blocks = ggml_cont(ctx, ggml_argsort_top_k(ctx, maxima_in_two(ctx, logits), kTop));
    ggml_tensor * values = ggml_get_rows(ctx, ggml_reshape_3d(ctx, logits, 128, n / 128, rows), blocks);
    return {blocks, values};
}

std::vector<ggml_tensor *> way_argmax(ggml_context * ctx, ggml_tensor * logits) { return {ggml_argmax(ctx, logits)}; }

int64_t id_narrow(const int32_t * blocks, int64_t j, int64_t) { return int64_t{blocks[j / 128]} * 128 + j % 128; }

int64_t id_pairs(const int32_t * blocks, int64_t j, int64_t n) {
    return j < 256 * kTop ? int64_t{blocks[j / 256]} * 256 + j % 256 : n / 256 * 256 + (j - 256 * kTop);
}

}  // namespace

int main(int argc, char ** argv) {
    const int64_t n_vocab = argc > 1 ? std::atoll(argv[1]) : 151936;
    const std::vector<int64_t> row_counts = fastpar_bench::int_list(argc > 2 ? argv[2] : "1,8,32,128,256");
    const int iterations = argc > 3 ? std::atoi(argv[3]) : 50;
    if (n_vocab % 128 != 0 || n_vocab / 256 < kTop || iterations < 1) {
        std::fprintf(stderr, "n_vocab must be a multiple of 128 with at least %d blocks of 256\n", kTop);
        return 2;
    }

    ggml_backend_t backend = ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_GPU, nullptr);
    if (backend == nullptr) {
        backend = ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, nullptr);
    }
    if (backend == nullptr) {
        std::fprintf(stderr, "no ggml backend\n");
        return 1;
    }
    ggml_backend_dev_t dev = ggml_backend_get_device(backend);
    ggml_backend_buffer_type_t host_type = ggml_backend_dev_host_buffer_type(dev);
    std::printf("backend %s (%s), n_vocab %lld, %d iterations a batch, median of 5 batches, us a step\n",
                ggml_backend_name(backend), ggml_backend_dev_description(dev), static_cast<long long>(n_vocab),
                iterations);

    const Way ways[] = {{"top_k", way_top_k, id_narrow},
                        {"argsort", way_argsort, id_narrow},
                        {"pairs", way_pairs, id_pairs},
                        {"pool", way_pool, nullptr},
                        {"pool2", way_pool2, nullptr},
                        {"argsort2", way_argsort2, id_narrow},
                        {"argmax", way_argmax, nullptr}};
    std::printf("%6s %10s", "rows", "copy");  // "!" after a time: a row's best token was not where it should be
    for (const Way & w : ways) {
        std::printf(" %10s", w.name);
    }
    std::printf("   (KB copied a row: copy %.0f, top_k %.1f, pairs %.1f)\n", n_vocab * 4 / 1024.0,
                (kTop * 128 * 4 + kTop * 4) / 1024.0, (kTop * 256 * 4 + (n_vocab % 256) * 4 + kTop * 4) / 1024.0);

    std::mt19937 rng(42);
    std::normal_distribution<float> normal(0.0f, 3.0f);
    for (const int64_t rows : row_counts) {
        // The logits, on the backend.
        ggml_init_params ip = {ggml_tensor_overhead() * 4, nullptr, true};
        ggml_context * data_ctx = ggml_init(ip);
        ggml_tensor * logits = ggml_new_tensor_2d(data_ctx, GGML_TYPE_F32, n_vocab, rows);
        ggml_backend_buffer_t data_buf = ggml_backend_alloc_ctx_tensors(data_ctx, backend);
        std::vector<float> ref(static_cast<size_t>(n_vocab * rows));
        for (float & x : ref) {
            x = normal(rng);
        }
        ggml_backend_tensor_set(logits, ref.data(), 0, ggml_nbytes(logits));
        std::vector<int64_t> best(static_cast<size_t>(rows));  // each row's argmax
        for (int64_t r = 0; r < rows; ++r) {
            const float * x = ref.data() + r * n_vocab;
            best[static_cast<size_t>(r)] = std::max_element(x, x + n_vocab) - x;
        }
        // Host memory for what comes back: enough for whole rows.
        const size_t host_bytes = ggml_nbytes(logits) + 4096;
        ggml_backend_buffer_t host_buf =
            host_type != nullptr ? ggml_backend_buft_alloc_buffer(host_type, host_bytes) : nullptr;
        std::vector<char> plain(host_buf == nullptr ? host_bytes : 0);
        char * host = host_buf != nullptr ? static_cast<char *>(ggml_backend_buffer_get_base(host_buf)) : plain.data();

        const auto median_us = [&](const std::function<void()> & step) {
            step();
            step();
            std::vector<double> batches;
            for (int b = 0; b < 5; ++b) {
                const double t0 = fastpar_bench::now_us();
                for (int i = 0; i < iterations; ++i) {
                    step();
                }
                batches.push_back((fastpar_bench::now_us() - t0) / iterations);
            }
            return fastpar_bench::median(batches);
        };

        std::printf("%6lld %10.1f", static_cast<long long>(rows),
                    median_us([&] { ggml_backend_tensor_get(logits, host, 0, ggml_nbytes(logits)); }));
        for (const Way & w : ways) {
            ggml_init_params gp = {ggml_tensor_overhead() * 64 + ggml_graph_overhead(), nullptr, true};
            ggml_context * ctx = ggml_init(gp);
            std::vector<ggml_tensor *> outs = w.build(ctx, logits);
            ggml_cgraph * gf = ggml_new_graph(ctx);
            for (ggml_tensor * t : outs) {
                ggml_set_output(t);
                ggml_build_forward_expand(gf, t);
            }
            ggml_gallocr_t galloc = ggml_gallocr_new(ggml_backend_get_default_buffer_type(backend));
            if (!ggml_gallocr_alloc_graph(galloc, gf)) {
                std::fprintf(stderr, "%s: could not allocate the graph\n", w.name);
                return 1;
            }
            const double us = median_us([&] {
                ggml_backend_graph_compute(backend, gf);
                size_t off = 0;
                for (ggml_tensor * t : outs) {
                    ggml_backend_tensor_get(t, host + off, 0, ggml_nbytes(t));
                    off += ggml_nbytes(t);
                }
            });
            // Every row's best logit must be among what came back, where it should be.
            bool right = true;
            if (w.id != nullptr) {
                const auto * blocks = reinterpret_cast<const int32_t *>(host);
                const auto * values = reinterpret_cast<const float *>(host + ggml_nbytes(outs[0]));
                const int64_t per_row = ggml_nelements(outs[1]) / rows;
                for (int64_t r = 0; r < rows && right; ++r) {
                    const float * v = values + r * per_row;
                    const int64_t j = std::max_element(v, v + per_row) - v;
                    right = w.id(blocks + r * outs[0]->ne[0], j, n_vocab) == best[static_cast<size_t>(r)];
                }
            } else if (std::strcmp(w.name, "argmax") == 0) {
                const auto * got = reinterpret_cast<const int32_t *>(host);
                for (int64_t r = 0; r < rows && right; ++r) {
                    right = got[r] == best[static_cast<size_t>(r)];
                }
            }
            std::printf(" %9.1f%s", us, right ? " " : "!");
            std::fflush(stdout);
            ggml_gallocr_free(galloc);
            ggml_free(ctx);
        }
        std::printf("\n");
        if (host_buf != nullptr) {
            ggml_backend_buffer_free(host_buf);
        }
        ggml_backend_buffer_free(data_buf);
        ggml_free(data_ctx);
    }
    ggml_backend_free(backend);
    return 0;
}
