// Every choice of the one loop that differs between a CPU and a GPU, resolved once when a
// Context is made (resolve_step_policy) and handed to the Scheduler; tests set it directly.
// docs/internals.md says why each GPU rule pays there and not on a CPU.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "core/threads/pool.hpp"

namespace fastpar {

// With one KV buffer per slot (kv_unified off), llama.cpp splits a batch into forward
// passes of sequences with consecutive seq_ids and an equal number of tokens each:
// decoding slots 3, 4 and 7 take two passes, not one. On a GPU a pass has a large fixed
// cost and a token a small one, so a gap of up to this many idle slots between decoding
// slots is padded with one throw-away token each (no logits, removed right after) and the
// step stays one pass. On a CPU a token costs about as much as a pass's fixed part.
constexpr size_t kMaxPaddedGapGpu = 32;

// Equal chunks pad a run of prompt chunks at most this many throw-away tokens for each
// shorter length they bring up to the target (each such length costs llama.cpp a pass
// more): a pass's fixed cost on a GPU (graph, launches, a read of the weights) is worth
// hundreds of tokens of a small model and still a few hundred of a 7B one.
constexpr int64_t kChunkPaddingPerPass = 256;

// For streaming (the Engine): decoding slots let new prompts go first at most this many
// steps in a row, so a running sequence still gets a token at least every
// kStreamingDecodeWaits + 1 steps. generate_parallel, where only the total time counts,
// lets prompts go first for as long as they fill a batch (kUnlimitedDecodeWaits).
constexpr int32_t kStreamingDecodeWaits = 3;
constexpr int32_t kUnlimitedDecodeWaits = std::numeric_limits<int32_t>::max();

// llama.cpp's CPU flash attention computes a KV stream's query rows with a tiled kernel
// from this many rows in a forward pass (ggml-cpu's GGML_FA_TILE_Q), one row at a time
// below. Over a long cached prefix the row kernel costs ~16x the tiled one a cell.
constexpr size_t kCpuTiledAttentionRows = 64;

// The cost model of widening a short suffix after a cached prefix to kCpuTiledAttentionRows
// rows and one (Scheduler::tiled_suffix_start): a prompt row costs its matrix products, in
// proportion to the model's parameters, plus its attention over the cells before it, per
// cell in proportion to n_layer x n_head x head size, times kRowKernelCellCost in the row
// kernel and kTiledKernelCellCost in the tiled one (units of a parameter's cost). Measured
// on the 2-core x86-64 machine, default model: a 51-token suffix after 1,500 cached tokens
// 18 ms a token, a 65-token one 4.9, a fresh 512-token chunk about 2.7 (docs/internals.md).
constexpr double kRowKernelCellCost = 30.0;
constexpr double kTiledKernelCellCost = 1.8;
// Fitted at one point, so a suffix is widened only where the model predicts this gain or more.
constexpr double kTiledSuffixMinGain = 1.5;

// A GPU's refill wave (StepPolicy::refill_wave) is this fraction of its slots: 32 of 256.
constexpr int32_t kRefillWaveDivisor = 8;

// For streaming (the Engine): a freed slot waits for its wave at most this many decode
// calls, so a queued request's first token comes at most that many steps later than a
// refill at once would give it. generate_parallel, where only the total time counts, waits
// for whole waves (kUnlimitedWaveHold).
constexpr int64_t kStreamingWaveHold = 8;
constexpr int64_t kUnlimitedWaveHold = std::numeric_limits<int64_t>::max();

struct StepPolicy {
    // Longest run of idle slots between decoding ones that a step pads (0: none).
    size_t max_padded_gap = 0;
    // When nothing waits for a slot and every running sequence generates, the highest ones
    // move down into idle slots below them (compact.cpp): a step over slots 0..n-1 costs
    // what n sequences need on a GPU, where one over scattered slots costs nearly a full one.
    bool compact_slots = false;
    // With prompts waiting and sequences running, freed slots take prompts only once this
    // many are free (or as many as wait), and compaction runs with prompts waiting too: the
    // refills come as one run of adjacent slots every few steps, not a scattered chunk or
    // two every step (docs/internals.md, "Refills in waves"). 0: each freed slot at once.
    // A request more urgent than a running one is never held back for a wave.
    size_t refill_wave = 0;
    // Decode calls a freed slot waits for its wave at most; then the waiting prompts take
    // the free slots as they are.
    int64_t max_wave_hold = kUnlimitedWaveHold;
    // Waiting prompts may take a whole batch while they fill it, the decoding slots
    // waiting (step_plan.hpp), at most max_decode_waits steps in a row.
    bool prompts_first = false;
    int32_t max_decode_waits = kUnlimitedDecodeWaits;
    // In a step whose rows with logits have different token counts (a prompt's last chunk
    // beside decoding slots, or prompts of different lengths), a prompt's last token (the
    // one whose logits choose its first token) is left for a later step, where it goes
    // alone. With one KV buffer per slot llama.cpp computes a step as passes of an equal
    // number of tokens per sequence, so such rows come out of order (a chunk's last token
    // after the single tokens of higher seq_ids), and llama.cpp puts them back in batch
    // order by swapping whole rows of the vocabulary's width, up to one swap a row (four
    // arrays a row with device sampling), single-threaded: on a GPU with 256 slots and
    // outputs of different lengths, more time than the decodes (docs/internals.md).
    bool last_prompt_token_alone = false;
    // Prompt chunks of adjacent slots that differ in length are padded with throw-away
    // tokens (no logits, removed right after) to one length (step_plan.hpp). llama.cpp
    // passes over a run of slots only as many tokens a slot as its shortest chunk has, then
    // over what is left, so 54 chunks of 31-41 tokens took 40 passes, 218-413 ms on an
    // H100 (docs/internals.md, "Equal chunks").
    bool equal_chunks = false;
    // Fewer than kMinPooled whole rows may have their first pass split over the pool's
    // threads (token_chooser.hpp): rows a GPU has just copied out, read from memory.
    bool split_rows = false;
    // How the sampling pool hands out runs (TaskPool::Options::for_gpu_output on a GPU).
    TaskPool::Options pool;
    // Threads besides the sampling thread that compute a grammar state's whole allowed set
    // together (structured output, GrammarCache): on a GPU the host's cores are idle while
    // a step runs there, and a whole mask of a large vocabulary takes milliseconds on one
    // of them. On a CPU they would take cores from llama.cpp's threads.
    int32_t mask_workers = 0;
    // Prompts that start alike copy the common prefix from one another's KV cache
    // (prefix_sharing.hpp): asked for, more than one slot, and a cache copyable by position.
    bool share_prefixes = false;
    // Samples of one prompt (GenerateParams::n > 1) copy the prompt's KV cache from one
    // another whatever share_prefixes says: more than one slot, a cache copyable by position.
    bool share_samples = false;
    // A prompt that finds a long prefix in the prefix cache or in a slot of its call and has
    // at most kCpuTiledAttentionRows tokens left reuses less, so that it decodes one more than
    // that, when the cost model says the tiled attention kernel saves more than the extra
    // rows cost (Scheduler::tiled_suffix_start): the
    // model's attention work a cell over its parameters (n_layer x n_head x head size /
    // n_params). 0: never (a GPU, whose kernels choose otherwise; a unified KV, where every
    // slot's rows are one stream's).
    double tiled_suffix_cell_weight = 0.0;
    // A call (Context::generate) admits its prompts in order of max_tokens, largest first
    // (stable): with more prompts than slots, the last prompts admitted otherwise end one by
    // one in steps that cost nearly a full one (a GPU's; a CPU's on a model too large for its
    // caches), where admitted first they run beside the rest (docs/internals.md, "A step").
    // The Engine serves requests in the order they come.
    bool longest_first = true;
};

// The policy of a context: `output_on_gpu` (Model::output_on_gpu), `kv_unified` (one KV
// buffer for all sequences), `memory_copies_by_position` (plain attention caches: not
// recurrent, hybrid or sliding-window), `share_prefixes` as asked, and the context's
// slots and threads. Padding needs copyable memory too: a padded token is removed by
// position afterwards; so does moving a sequence to another slot (a whole-buffer copy).
inline StepPolicy resolve_step_policy(bool output_on_gpu, bool kv_unified, bool memory_copies_by_position,
                                      bool share_prefixes, int32_t n_parallel, int32_t n_threads) {
    StepPolicy policy;
    const bool gpu_slot_buffers = output_on_gpu && !kv_unified;  // a KV buffer per slot, steps on a GPU
    policy.max_padded_gap = gpu_slot_buffers && memory_copies_by_position ? kMaxPaddedGapGpu : 0;
    policy.compact_slots = gpu_slot_buffers && memory_copies_by_position;
    policy.refill_wave = policy.compact_slots ? static_cast<size_t>(std::max(1, n_parallel / kRefillWaveDivisor)) : 0;
    policy.prompts_first = gpu_slot_buffers;
    policy.last_prompt_token_alone = gpu_slot_buffers;
    policy.equal_chunks = gpu_slot_buffers && memory_copies_by_position;
    policy.max_decode_waits = kUnlimitedDecodeWaits;
    policy.split_rows = output_on_gpu && n_threads > 1;
    // On a GPU the pool's cores are idle while a step runs there: its workers wake ahead
    // of the next step's sampling. On a CPU they would take cores from llama.cpp's threads.
    policy.pool = output_on_gpu ? TaskPool::Options::for_gpu_output() : TaskPool::Options{};
    policy.mask_workers = output_on_gpu ? std::max(0, n_threads - 1) : 0;
    policy.share_prefixes = share_prefixes && n_parallel > 1 && memory_copies_by_position;
    policy.share_samples = n_parallel > 1 && memory_copies_by_position;
    return policy;
}

// An Engine's policy over its context's: its requests stream, so running sequences wait for
// prompts at most kStreamingDecodeWaits steps in a row, and a freed slot waits for a wave
// at most kStreamingWaveHold decode calls.
inline StepPolicy streaming_step_policy(StepPolicy policy) {
    policy.max_decode_waits = kStreamingDecodeWaits;
    policy.max_wave_hold = kStreamingWaveHold;
    return policy;
}

}  // namespace fastpar
