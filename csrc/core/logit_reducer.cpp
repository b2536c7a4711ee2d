#include "core/logit_reducer.hpp"

#include <algorithm>
#include <string>

#include "core/errors.hpp"
#include "ggml.h"

namespace fastpar {

struct LogitReducer::Part {
    LogitReducer * owner = nullptr;
};

namespace {

// The widest power of two up to 128 that splits n into more than `min_blocks` blocks.
int32_t block_width(int64_t n, int32_t min_blocks) {
    for (int32_t w = 128; w >= 8; w /= 2) {
        if (n % w == 0 && n / w > min_blocks) {
            return w;
        }
    }
    return 0;
}

const char * reducer_name(const llama_sampler *) { return "fastpar-top-blocks"; }

// On the host (llama.cpp calls this only if asked to sample with the chain itself, which
// fastpar never does): the first of the largest candidates, as the greedy sampler picks.
void reducer_apply(llama_sampler *, llama_token_data_array * cur_p) {
    if (cur_p->size == 0) {
        return;
    }
    size_t best = 0;
    for (size_t i = 1; i < cur_p->size; ++i) {
        if (cur_p->data[i].logit > cur_p->data[best].logit) {
            best = i;
        }
    }
    cur_p->selected = static_cast<int64_t>(best);
}

// The Part belongs to the reducer, not to the sampler object.
void reducer_free(llama_sampler *) {}

bool reducer_backend_init(llama_sampler *, ggml_backend_buffer_type_t, uint32_t) { return true; }

}  // namespace

int32_t LogitReducer::block_for(int32_t n_vocab) { return block_width(n_vocab, kTopBlocks); }

bool LogitReducer::serves(const GenerateParams & p) {
    if (has_penalties(p) || p.logprobs) {
        return false;
    }
    return p.temperature <= 0.0f || (p.top_k > 0 && p.top_k <= kTopBlocks);
}

LogitReducer::LogitReducer(int32_t n_vocab, int32_t n_seq)
    : n_vocab_(n_vocab), block_(block_for(n_vocab)), parts_(static_cast<size_t>(n_seq)) {
    if (block_ == 0) {
        throw Error("device sampling cannot split a vocabulary of " + std::to_string(n_vocab) + " tokens into blocks");
    }
    for (Part & part : parts_) {
        part.owner = this;
    }
    chains_.resize(parts_.size());
}

llama_sampler * LogitReducer::new_chain(int32_t seq) {
    static llama_sampler_i iface = {
        /* .name              = */ reducer_name,
        /* .accept            = */ nullptr,
        /* .apply             = */ reducer_apply,
        /* .reset             = */ nullptr,
        /* .clone             = */ nullptr,
        /* .free              = */ reducer_free,
        /* .backend_init      = */ reducer_backend_init,
        /* .backend_accept    = */ nullptr,
        /* .backend_apply     = */ &LogitReducer::backend_apply,
        /* .backend_set_input = */ nullptr,
        /* .backend_reset     = */ &LogitReducer::backend_reset,
        /* .copy_state        = */ nullptr,
    };
    // llama_set_sampler takes sampler chains only: a chain of one.
    llama_sampler_chain_params cp = llama_sampler_chain_default_params();
    cp.no_perf = true;
    SamplerPtr chain(llama_sampler_chain_init(cp));
    llama_sampler * reducer = llama_sampler_init(&iface, &parts_[static_cast<size_t>(seq)]);
    if (!chain || reducer == nullptr) {
        throw Error("could not create a device sampler");
    }
    llama_sampler_chain_add(chain.get(), reducer);  // the chain owns it from here
    chains_[static_cast<size_t>(seq)] = std::move(chain);
    return chains_[static_cast<size_t>(seq)].get();
}

LogitReducer::~LogitReducer() = default;

void LogitReducer::backend_reset(llama_sampler * smpl) {
    LogitReducer & self = *static_cast<Part *>(smpl->ctx)->owner;
    self.src_ = self.blocks_ = self.values_ = nullptr;
}

void LogitReducer::build(ggml_context * ctx, ggml_tensor * logits) {
    // `logits` is [n, rows]: llama.cpp's whole logits tensor (a 1-D probe when it sizes
    // the graph). A row too short to split is one block.
    const int64_t n = logits->ne[0];
    const int64_t rows = ggml_nrows(logits);
    width_ = block_width(n, kTopBlocks);
    if (width_ == 0) {
        width_ = static_cast<int32_t>(n);
    }
    const int64_t n_blocks = n / width_;
    top_ = static_cast<int32_t>(std::min<int64_t>(kTopBlocks, n_blocks));
    ggml_tensor * maxima = ggml_pool_1d(ctx, logits, GGML_OP_POOL_MAX, width_, width_, 0);  // [n_blocks, rows]
    ggml_set_name(maxima, "fastpar_block_max");
    blocks_ = ggml_top_k(ctx, maxima, top_);  // I32 [top, rows], in no particular order
    ggml_set_name(blocks_, "fastpar_top_blocks");
    values_ = ggml_get_rows(ctx, ggml_reshape_3d(ctx, logits, width_, n_blocks, rows), blocks_);  // [width, top, rows]
    ggml_set_name(values_, "fastpar_top_block_logits");
    ggml_set_output(blocks_);
    ggml_set_output(values_);
}

void LogitReducer::backend_apply(llama_sampler * smpl, ggml_context * ctx, ggml_cgraph *, llama_sampler_data * data) {
    LogitReducer & self = *static_cast<Part *>(smpl->ctx)->owner;
    // data->logits is this sequence's row: a view into the whole logits tensor, or (probe)
    // a tensor of its own.
    ggml_tensor * whole = data->logits->view_src != nullptr ? data->logits->view_src : data->logits;
    if (whole != self.src_) {
        self.build(ctx, ggml_is_contiguous(whole) ? whole : ggml_cont(ctx, whole));
        self.src_ = whole;
    }
    const size_t row = data->logits->view_src != nullptr ? data->logits->view_offs / whole->nb[1] : 0;
    data->candidates = ggml_view_1d(ctx, self.blocks_, self.top_, row * self.blocks_->nb[1]);
    data->logits = ggml_view_1d(ctx, self.values_, static_cast<int64_t>(self.width_) * self.top_,
                                row * self.values_->nb[2]);
}

bool LogitReducer::row(llama_context * ctx, int32_t i, LogitRow & out) const {
    // Both are set together, by backend_apply; a row without them was not reduced. (The
    // count accessors would tell too, but every accessor synchronises the context.)
    const float * logits = llama_get_sampled_logits_ith(ctx, i);
    const llama_token * blocks = logits != nullptr ? llama_get_sampled_candidates_ith(ctx, i) : nullptr;
    if (blocks == nullptr) {
        return false;
    }
    const llama_token n_blocks = n_vocab_ / block_;
    if (!std::all_of(blocks, blocks + kTopBlocks, [&](llama_token b) { return b >= 0 && b < n_blocks; })) {
        throw Error("device sampling got a block index outside the vocabulary back from llama.cpp");
    }
    out = LogitRow{logits, kTopBlocks * block_, blocks, block_};
    return true;
}

}  // namespace fastpar
