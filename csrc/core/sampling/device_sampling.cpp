#include "core/sampling/device_sampling.hpp"

#include <algorithm>
#include <string>

#include "core/base/errors.hpp"
#include "ggml.h"

namespace fastpar {

struct DeviceSampling::Part {
    DeviceSampling * owner = nullptr;
    llama_seq_id seq = 0;
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

int32_t DeviceSampling::block_for(int32_t n_vocab) { return block_width(n_vocab, kTopBlocks); }

bool DeviceSampling::serves(const ChainShape & shape) {
    // A grammar's mask may allow none of the candidates: constrained rows come whole.
    const int32_t k = shape.keeps_best();
    return !shape.whole_rows && k > 0 && k <= kTopBlocks;
}

DeviceSampling::DeviceSampling(int32_t n_vocab, int32_t n_seq)
    : n_vocab_(n_vocab), block_(block_for(n_vocab)), parts_(static_cast<size_t>(n_seq)) {
    if (block_ == 0) {
        throw Error("device sampling cannot split a vocabulary of " + std::to_string(n_vocab) + " tokens into blocks");
    }
    for (size_t seq = 0; seq < parts_.size(); ++seq) {
        parts_[seq].owner = this;
        parts_[seq].seq = static_cast<llama_seq_id>(seq);
    }
    chains_.resize(parts_.size());
    attached_.assign(parts_.size(), 1);
    index_of_seq_.assign(parts_.size(), -1);
    ran_.resize(parts_.size());
}

llama_sampler * DeviceSampling::new_chain(int32_t seq) {
    static llama_sampler_i iface = {
        /* .name              = */ reducer_name,
        /* .accept            = */ nullptr,
        /* .apply             = */ reducer_apply,
        /* .reset             = */ nullptr,
        /* .clone             = */ nullptr,
        /* .free              = */ reducer_free,
        /* .backend_init      = */ reducer_backend_init,
        /* .backend_accept    = */ nullptr,
        /* .backend_apply     = */ &DeviceSampling::backend_apply,
        /* .backend_set_input = */ &DeviceSampling::backend_set_input,
        /* .backend_reset     = */ &DeviceSampling::backend_reset,
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

DeviceSampling::~DeviceSampling() = default;

bool DeviceSampling::attach(llama_context * ctx, llama_seq_id seq, bool on) {
    char & attached = attached_[static_cast<size_t>(seq)];
    if (on != static_cast<bool>(attached)) {
        // Only when the kind of request changes: llama.cpp re-reserves its graph after it.
        if (llama_set_sampler(ctx, seq, on ? new_chain(seq) : nullptr) || !on) {
            attached = on ? 1 : 0;
        }
    }
    return on && attached;
}

void DeviceSampling::detach_all(llama_context * ctx) {
    for (size_t seq = 0; seq < attached_.size(); ++seq) {
        if (attached_[seq]) {
            llama_set_sampler(ctx, static_cast<llama_seq_id>(seq), nullptr);
        }
    }
}

void DeviceSampling::backend_reset(llama_sampler * smpl) {
    DeviceSampling & self = *static_cast<Part *>(smpl->ctx)->owner;
    self.src_ = self.blocks_ = self.values_ = nullptr;
}

void DeviceSampling::build(ggml_context * ctx, ggml_tensor * logits, bool in_decode) {
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
    // Block maxima in two pooling ops, over 8 logits and then over width / 8 of those
    // maxima: ggml's CUDA pooling runs one thread an output value, so one op over 128
    // logits leaves a thread reading 128 in a row, several times slower than two ops
    // (bench/c/reducer_ops.cpp measures both).
    ggml_tensor * maxima = logits;
    int64_t left = width_;
    if (left >= 16 && left % 8 == 0) {
        maxima = ggml_pool_1d(ctx, maxima, GGML_OP_POOL_MAX, 8, 8, 0);  // [n / 8, rows]
        left /= 8;
    }
    maxima = ggml_pool_1d(ctx, maxima, GGML_OP_POOL_MAX, static_cast<int>(left), static_cast<int>(left), 0);
    ggml_set_name(maxima, "fastpar_block_max");
    blocks_ = ggml_cont(ctx, ggml_argsort_top_k(ctx, maxima, top_));  // I32 [top, rows], best first
    ggml_set_name(blocks_, "fastpar_top_blocks");
    values_ = ggml_get_rows(ctx, ggml_reshape_3d(ctx, logits, width_, n_blocks, rows), blocks_);  // [width, top, rows]
    ggml_set_name(values_, "fastpar_top_block_logits");
    ggml_set_output(blocks_);
    ggml_set_output(values_);

    // Grouped copies when this pass holds every row the decode asks for and each has the
    // chain. (llama.cpp pads the logits tensor with one row at the end, not an output.)
    const int64_t outputs = logits->op == GGML_OP_PAD ? ggml_nrows(logits->src[0]) : rows;
    auto layout = std::make_shared<Layout>();
    layout->top = top_;
    layout->per_row = int64_t{width_} * top_;
    if (in_decode && all_attached_ && n_expected_ > 0 && outputs == n_expected_) {
        // A copy may fill one row of llama.cpp's output buffer: n_vocab values.
        layout->n_rows = n_expected_;
        layout->group = static_cast<int32_t>(std::max<int64_t>(1, n_vocab_ / layout->per_row));
        layout->group_blocks = std::max(1, n_vocab_ / top_);
        layout->seq_of_row.assign(static_cast<size_t>(n_expected_), -1);
        layout->row_of_seq.assign(parts_.size(), -1);
    }
    layout_ = std::move(layout);
}

void DeviceSampling::backend_apply(llama_sampler * smpl, ggml_context * ctx, ggml_cgraph *, llama_sampler_data * data) {
    const Part & part = *static_cast<Part *>(smpl->ctx);
    DeviceSampling & self = *part.owner;
    // data->logits is this sequence's row: a view into the whole logits tensor, or (probe)
    // a tensor of its own. A sequence without a row in this pass gets row 0 (llama.cpp
    // ignores what it returns).
    const bool in_decode = data->logits->view_src != nullptr;
    ggml_tensor * whole = in_decode ? data->logits->view_src : data->logits;
    if (whole != self.src_) {
        self.build(ctx, ggml_is_contiguous(whole) ? whole : ggml_cont(ctx, whole), in_decode);
        self.src_ = whole;
    }
    const int64_t row = in_decode ? static_cast<int64_t>(data->logits->view_offs / whole->nb[1]) : 0;
    Layout & layout = *self.layout_;
    const int64_t per_row = layout.per_row;
    if (layout.group == 0) {
        data->candidates = ggml_view_1d(ctx, self.blocks_, self.top_, row * self.blocks_->nb[1]);
        data->logits = ggml_view_1d(ctx, self.values_, per_row, row * self.values_->nb[2]);
        return;
    }
    // Every sequence the decode asks for has its row in this pass, so a sequence asked for
    // is one with a row here.
    if (row < layout.n_rows && self.index_of_seq_[static_cast<size_t>(part.seq)] >= 0) {
        layout.row_of_seq[static_cast<size_t>(part.seq)] = static_cast<int32_t>(row);
        layout.seq_of_row[static_cast<size_t>(row)] = part.seq;
    }
    const int64_t left = layout.n_rows - row;
    data->logits = left > 0 && row % layout.group == 0
                       ? ggml_view_1d(ctx, self.values_, std::min<int64_t>(layout.group, left) * per_row,
                                      static_cast<size_t>(row) * self.values_->nb[2])
                       : nullptr;
    data->candidates = left > 0 && row % layout.group_blocks == 0
                           ? ggml_view_1d(ctx, self.blocks_, std::min<int64_t>(layout.group_blocks, left) * self.top_,
                                          static_cast<size_t>(row) * self.blocks_->nb[1])
                           : nullptr;
}

void DeviceSampling::backend_set_input(llama_sampler * smpl) {
    // Called for each sequence with a row in the pass about to run, after llama.cpp built
    // its graph or chose to reuse the last one: either way layout_ describes it.
    const Part & part = *static_cast<Part *>(smpl->ctx);
    part.owner->ran_[static_cast<size_t>(part.seq)] = part.owner->layout_;
}

void DeviceSampling::expect(const llama_batch & batch, bool all_attached) {
    std::fill(index_of_seq_.begin(), index_of_seq_.end(), -1);
    std::fill(ran_.begin(), ran_.end(), nullptr);
    leaders_of_ = nullptr;
    n_expected_ = 0;
    for (int32_t i = 0; i < batch.n_tokens; ++i) {
        const llama_seq_id seq = batch.seq_id[i][0];
        if (batch.logits[i] && seq >= 0 && static_cast<size_t>(seq) < index_of_seq_.size()) {
            index_of_seq_[static_cast<size_t>(seq)] = i;
            ++n_expected_;
        }
    }
    all_attached_ = all_attached;
}

bool DeviceSampling::row(llama_context * ctx, llama_seq_id seq, int32_t i, LogitRow & out) {
    const Layout * layout = ran_[static_cast<size_t>(seq)].get();
    if (layout != nullptr && layout->group > 0) {
        return grouped_row(ctx, *layout, seq, out);
    }
    // Both are set together, by backend_apply; a row without them was not reduced. (The
    // count accessors would tell too, but every accessor synchronises the context.)
    const float * logits = llama_get_sampled_logits_ith(ctx, i);
    const llama_token * blocks = logits != nullptr ? llama_get_sampled_candidates_ith(ctx, i) : nullptr;
    if (blocks == nullptr) {
        return false;
    }
    out = LogitRow{logits, kTopBlocks * block_, blocks, block_};
    check_blocks(out);
    return true;
}

bool DeviceSampling::grouped_row(llama_context * ctx, const Layout & layout, llama_seq_id seq, LogitRow & out) {
    const int32_t row = layout.row_of_seq[static_cast<size_t>(seq)];
    if (row < 0) {
        throw Error("device sampling lost the row of sequence " + std::to_string(seq));
    }
    if (leaders_of_ != &layout) {
        leaders_of_ = &layout;
        leader_logits_.assign(static_cast<size_t>((layout.n_rows + layout.group - 1) / layout.group), nullptr);
        leader_blocks_.assign(static_cast<size_t>((layout.n_rows + layout.group_blocks - 1) / layout.group_blocks),
                              nullptr);
    }
    const int64_t per_row = layout.per_row;
    // A leader's copy is found (and its size checked) once a decode; llama.cpp's accessors
    // each synchronise the context.
    const auto leader = [&](int32_t group, bool blocks) -> const void * {
        const int32_t first = row - row % group;
        const llama_seq_id lead = layout.seq_of_row[static_cast<size_t>(first)];
        const int32_t i = lead >= 0 ? index_of_seq_[static_cast<size_t>(lead)] : -1;
        const int64_t want = std::min(group, layout.n_rows - first) * (blocks ? int64_t{layout.top} : per_row);
        const void * p = nullptr;
        int64_t got = -1;
        if (i >= 0) {
            p = blocks ? static_cast<const void *>(llama_get_sampled_candidates_ith(ctx, i))
                       : static_cast<const void *>(llama_get_sampled_logits_ith(ctx, i));
            got = blocks ? llama_get_sampled_candidates_count_ith(ctx, i) : llama_get_sampled_logits_count_ith(ctx, i);
        }
        if (p == nullptr || got != want) {
            throw Error("device sampling found no copy of " + std::to_string(want) + (blocks ? " block indices" : " logits") +
                        " for rows " + std::to_string(first) + ".. of a pass (got " + std::to_string(got) + ")");
        }
        return p;
    };
    const size_t g = static_cast<size_t>(row / layout.group), gb = static_cast<size_t>(row / layout.group_blocks);
    if (leader_logits_[g] == nullptr) {
        leader_logits_[g] = static_cast<const float *>(leader(layout.group, false));
    }
    if (leader_blocks_[gb] == nullptr) {
        leader_blocks_[gb] = static_cast<const llama_token *>(leader(layout.group_blocks, true));
    }
    out = LogitRow{leader_logits_[g] + (row % layout.group) * per_row, static_cast<int32_t>(per_row),
                   leader_blocks_[gb] + (row % layout.group_blocks) * layout.top, block_};
    check_blocks(out);
    return true;
}

void DeviceSampling::check_blocks(const LogitRow & row) const {
    const llama_token n_blocks = n_vocab_ / block_;
    if (!std::all_of(row.blocks, row.blocks + kTopBlocks, [&](llama_token b) { return b >= 0 && b < n_blocks; })) {
        throw Error("device sampling got a block index outside the vocabulary back from llama.cpp");
    }
}

}  // namespace fastpar
