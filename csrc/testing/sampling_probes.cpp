// The sampling probes: fastpar's host sampling against llama.cpp's own chain, and the
// token chooser's ways by name.
#include <algorithm>
#include <memory>

#include "core/base/errors.hpp"
#include "core/sampling/sampling.hpp"
#include "core/threads/pool.hpp"
#include "testing/probes.hpp"

namespace fastpar {

std::pair<std::vector<llama_token>, std::vector<llama_token>> sample_against_llama(
    const GenerateParams & params, uint32_t seed, const std::vector<float> & logits,
    const std::vector<llama_token> & blocks, int32_t width, int32_t draws, int32_t split_rows,
    int32_t pool_workers) {
    const auto n = static_cast<int32_t>(logits.size());
    std::vector<float> kept;
    LogitRow row{logits.data(), n};
    if (!blocks.empty()) {
        for (const llama_token b : blocks) {
            if (width <= 0 || b < 0 || static_cast<int64_t>(b + 1) * width > n) {
                throw InvalidArgument("a block lies outside the row");
            }
            kept.insert(kept.end(), logits.begin() + b * width, logits.begin() + (b + 1) * width);
        }
        row = LogitRow{kept.data(), static_cast<int32_t>(kept.size()), blocks.data(), width};
    }
    const ChainShape shape = ChainShape::of(params);
    if (split_rows > 0 && !splits(shape, row)) {
        throw InvalidArgument("split_rows needs a whole row and a chain that splits()");
    }
    const auto copies = static_cast<size_t>(std::max(split_rows, 1));
    std::vector<SamplerPtr> ours;
    for (size_t c = 0; c < copies; ++c) {
        ours.push_back(make_sampler(params, seed, n));
    }
    SamplerPtr theirs = make_sampler(params, seed, n);
    std::unique_ptr<TaskPool> pool;
    if (split_rows > 0) {
        pool = std::make_unique<TaskPool>(std::max(pool_workers, 0), TaskPool::Options::for_gpu_output());
    }
    std::vector<llama_token_data> cur, whole(static_cast<size_t>(n));
    std::vector<float> buffer;
    std::pair<std::vector<llama_token>, std::vector<llama_token>> out;
    for (int32_t d = 0; d < draws; ++d) {
        if (pool) {
            std::vector<LogitRow> rows(copies, row);
            std::vector<llama_token> picked(copies, LLAMA_TOKEN_NULL);
            choose_split(*pool, rows, buffer, [&](size_t i) {
                thread_local std::vector<llama_token_data> cur_i;
                picked[i] = sample_logits(ours[i].get(), shape, rows[i], cur_i);
            });
            out.first.insert(out.first.end(), picked.begin(), picked.end());
        } else {
            out.first.push_back(sample_logits(ours[0].get(), shape, row, cur));
        }
        for (int32_t t = 0; t < n; ++t) {
            whole[static_cast<size_t>(t)] = llama_token_data{t, logits[static_cast<size_t>(t)], 0.0f};
        }
        out.second.insert(out.second.end(), copies, apply_chain(theirs.get(), whole, false));
    }
    return out;
}

const char * way_name(TokenChooser::Way way) {
    switch (way) {
        case TokenChooser::Way::Pooled:
            return "pooled";
        case TokenChooser::Way::Split:
            return "split";
        case TokenChooser::Way::OneThread:
            break;
    }
    return "one_thread";
}

}  // namespace fastpar
