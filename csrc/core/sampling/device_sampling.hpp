// Device sampling: every row of logits is cut down to its best candidates inside
// llama.cpp's graph, on the device that runs the output layer, for all rows at once; only
// those candidates come back, and the rest of each sequence's chain runs on the host.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/base/params.hpp"
#include "core/sampling/sampling.hpp"
#include "llama.h"

namespace fastpar {

// How it works. A row of n_vocab logits is split into blocks of `block` logits (a power of
// two up to 128 that divides n_vocab). In the graph, for every row at once: the largest
// logit of each block (two pooling ops: over 8 logits, then over those maxima), the
// kTopBlocks blocks with the largest maxima (one sort of the n_vocab / block maxima of
// every row, ggml_argsort_top_k: ggml_top_k would run one CUB top-k a row on CUDA with
// CCCL 3.2 and later) and those blocks' logits (one gather). The k best logits of a row,
// for any k <= kTopBlocks, all lie in those blocks: a block holding one of them has a
// maximum at least as large as the k-th best, and a block holding none has a smaller one.
// So greedy and top-k chains pick from the candidates exactly what they would pick from
// the whole row (up to exact ties at the k-th place), and a step copies kTopBlocks * block
// logits a row back instead of n_vocab (8,192 of 151,936 for Qwen3).
//
// llama.cpp asks each sequence's sampler for its part of the graph in turn; the first one
// asked builds the ops over the whole logits tensor, and each returns views of its
// own row. One chain per slot goes in with the context (llama_context_params.samplers) and
// stays, whatever greedy or top-k settings the requests use; only a request that needs
// whole rows detaches it (a later one attaches a new chain), and each such change makes
// llama.cpp re-reserve its graph.
//
// llama.cpp copies what each sampler returns on its own: two small copies a row, 512 a
// step with 256 slots, each with a fixed cost on the device and the host. So when one
// forward pass holds every row a decode asks for and all of them have the chain (the
// usual generation step), the rows are grouped: the sampler of every `group`-th row
// returns a view of its row and the next ones (as many as fit in one row of llama.cpp's
// output buffer, 18 for Qwen3's vocabulary), the others return nothing, and
// row() finds a sequence's candidates inside its group leader's copy. Which pass gave a
// sequence its row, and in which layout, is recorded when llama.cpp sets the pass's
// inputs (it does for reused graphs too), so a decode split into several passes, or one
// that reuses an earlier grouped graph, is read correctly.
class DeviceSampling {
public:
    // The most top-k a chain may ask for and still start from the candidates.
    static constexpr int32_t kTopBlocks = 64;

    // The block width for a vocabulary: the largest power of two up to 128 that divides
    // n_vocab into more than kTopBlocks blocks; 0 when there is none (no reduction).
    static int32_t block_for(int32_t n_vocab);
    // Whether a chain of shape `shape` can start from the candidates: it keeps only the
    // best 1..kTopBlocks of a row (greedy or top-k, no bias or penalties: they change logits
    // outside the candidates), and its request does not need whole rows (no logprobs,
    // top_logprobs, json_schema, grammar or choice: ChainShape::whole_rows).
    static bool serves(const ChainShape & shape);

    // n_vocab must have a block (block_for > 0); n_seq is the number of slots.
    DeviceSampling(int32_t n_vocab, int32_t n_seq);
    ~DeviceSampling();
    DeviceSampling(const DeviceSampling &) = delete;
    DeviceSampling & operator=(const DeviceSampling &) = delete;

    // A chain to attach to sequence `seq` (llama_set_sampler). llama.cpp initialises a
    // chain when it is attached and only once, so each attach takes a new one; it replaces
    // (frees) the previous chain for `seq`, which must have been detached, and llama.cpp
    // drops every graph that used it before its next decode. Free the reducer only after
    // the context has been freed or the chains detached.
    llama_sampler * new_chain(int32_t seq);

    // Slots the reducer was made for.
    int32_t n_seq() const { return static_cast<int32_t>(attached_.size()); }

    // Which slots have their chain attached (llama_set_sampler). Every chain goes in with
    // the context (llama_context_params.samplers), so all start attached. A slot whose
    // request needs whole rows detaches its chain; attaching or detaching makes llama.cpp
    // re-reserve its graph, so a chain stays attached across requests and calls while
    // they can use it. attach() attaches sequence `seq`'s chain (`on`) or detaches it,
    // only when that changes, and returns whether its rows are now cut down on the device.
    bool attach(llama_context * ctx, llama_seq_id seq, bool on);
    // Detaches every attached chain: before the context is freed.
    void detach_all(llama_context * ctx);

    // Before every llama_decode: which rows `batch` asks for (one a sequence at most), and
    // whether every sequence asking has this reducer's chain attached.
    void expect(const llama_batch & batch, bool all_attached);

    // The candidates llama.cpp copied back for sequence `seq`, whose row is batch index
    // `i` of the last decode, as a LogitRow pointing into its output buffer (kTopBlocks
    // blocks of block() logits). False if it has none (the reducer did not run: llama.cpp
    // then copied the whole row). Not thread-safe (it goes through llama_context); read
    // rows on the decoding thread, sample from them anywhere.
    bool row(llama_context * ctx, llama_seq_id seq, int32_t i, LogitRow & out);

private:
    struct Part;  // what each sequence's sampler points to
    // Where a graph's samplers put their rows (see above): `group` 0 means one copy a row.
    struct Layout {
        int32_t top = 0;           // blocks a row
        int64_t per_row = 0;       // logits a row: top blocks of the block width
        // Grouped layouts only:
        int32_t n_rows = 0;        // output rows of the pass
        int32_t group = 0;         // rows one logits copy holds
        int32_t group_blocks = 0;  // rows one block-index copy holds
        std::vector<llama_seq_id> seq_of_row;
        std::vector<int32_t> row_of_seq;  // [seq], -1 for none
    };

    static void backend_apply(llama_sampler * smpl, ggml_context * ctx, ggml_cgraph * gf,
                              llama_sampler_data * data);
    static void backend_set_input(llama_sampler * smpl);
    static void backend_reset(llama_sampler * smpl);
    void build(ggml_context * ctx, ggml_tensor * logits, bool in_decode);
    bool grouped_row(llama_context * ctx, const Layout & layout, llama_seq_id seq, LogitRow & out);
    void check_blocks(const LogitRow & row) const;

    int32_t n_vocab_;
    int32_t block_;
    // The ops of the graph being built (reset before every build).
    ggml_tensor * src_ = nullptr;     // the logits tensor they were built for
    ggml_tensor * blocks_ = nullptr;  // I32 [kTopBlocks, rows]
    ggml_tensor * values_ = nullptr;  // F32 [block, kTopBlocks, rows]
    int32_t top_ = 0;                 // blocks kept a row (kTopBlocks, or fewer for a short row)
    int32_t width_ = 0;               // block width used in that graph
    std::shared_ptr<Layout> layout_;  // of that graph
    std::vector<Part> parts_;
    std::vector<SamplerPtr> chains_;  // [seq]: the last one made
    std::vector<char> attached_;      // [seq]
    // The decode under way or last done:
    std::vector<int32_t> index_of_seq_;                // [seq]: batch index of its row, -1 for none
    int32_t n_expected_ = 0;                           // rows it asks for
    bool all_attached_ = false;
    std::vector<std::shared_ptr<const Layout>> ran_;  // [seq]: layout of the pass that gave its row
    // Group leaders' copies, found once a decode: [row / group] of the grouped layout read.
    const Layout * leaders_of_ = nullptr;
    std::vector<const float *> leader_logits_;
    std::vector<const llama_token *> leader_blocks_;
};

}  // namespace fastpar
