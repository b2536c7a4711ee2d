// The one loop (docs/design.md): n_parallel slots over one llama_context, a FIFO of pending
// requests, and one llama_batch reused for every step. generate_parallel drives it on
// the calling thread; nothing else decodes.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/logit_reducer.hpp"
#include "core/model.hpp"
#include "core/params.hpp"
#include "core/pool.hpp"
#include "core/sampling.hpp"
#include "llama.h"

namespace fastpar {

using Clock = std::chrono::steady_clock;

struct Request {
    Prompt prompt;
    std::shared_ptr<const GenerateParams> params;
    uint32_t seed = 0;                           // resolved sampler seed
    std::function<void(Completion &&)> on_done;  // called once, on the scheduler's thread
    std::function<void()> on_start;              // optional: called when it gets a slot
    // Optional: called with each new piece of text (valid UTF-8, never the start of a
    // possible stop string) as it is generated; the pieces add up to Completion::text.
    std::function<void(const std::string &)> on_text;
    // Optional: set from any thread to cancel; the scheduler notices between steps.
    std::shared_ptr<std::atomic<bool>> cancel;
    Clock::time_point t_submit = Clock::now();
};

// What a context keeps for device sampling (logit_reducer.hpp): the reducer, and which
// slots have its chain attached (llama_set_sampler). Slots whose request needs the whole
// row of logits detach it; attaching or detaching makes llama.cpp re-reserve its graph,
// so a chain stays attached across requests and calls while they can use it.
struct DeviceSampling {
    std::unique_ptr<LogitReducer> reducer;
    std::vector<char> attached;  // [seq]
};

// Appends one token of one sequence to `batch` (which has room for it); returns its index.
inline int32_t batch_add(llama_batch & batch, llama_token token, llama_pos pos, llama_seq_id seq, bool logits) {
    const int32_t i = batch.n_tokens++;
    batch.token[i] = token;
    batch.pos[i] = pos;
    batch.n_seq_id[i] = 1;
    batch.seq_id[i][0] = seq;
    batch.logits[i] = logits;
    return i;
}

class Scheduler {
public:
    // `batch` must hold at least n_batch tokens; `n_ctx_seq` is what one sequence may use.
    // `pool` (may be null) samples many sequences on the host at once. With `device` (kept
    // by the context), rows of logits are cut down to their best candidates inside the
    // graph and only those come back, for every request whose chain can start from them
    // (LogitReducer::serves); the others get whole rows. With
    // `share_prefixes`, a prompt that starts like another one copies that common prefix
    // from the other's KV cache rather than decoding it again (models whose memory cannot
    // be copied by position, recurrent, hybrid or sliding-window, decode everything).
    // `kv_unified` says the context has one KV buffer for all sequences; without it, and
    // with the model on a GPU, steps are shaped so that llama.cpp runs them in few forward
    // passes (scheduler.cpp says how).
    Scheduler(const Model & model, llama_context * ctx, llama_batch & batch, int32_t n_parallel,
              int32_t n_batch, int32_t n_ctx_seq, Stats & stats, TaskPool * pool = nullptr,
              DeviceSampling * device = nullptr, bool share_prefixes = false,
              bool kv_unified = false);
    // Cancels whatever is still queued or running, so the context is left clean.
    ~Scheduler();
    Scheduler(const Scheduler &) = delete;
    Scheduler & operator=(const Scheduler &) = delete;

    // For streaming (the Engine): on a GPU, decoding slots let new prompts go first at most
    // kStreamingDecodeWaits steps in a row, so a running sequence still gets a token at
    // least every kStreamingDecodeWaits + 1 steps. Without it (generate_parallel, where only
    // the total time counts) prompts go first for as long as they fill a batch.
    static constexpr int32_t kStreamingDecodeWaits = 3;
    void limit_decode_waits() { max_decode_waits_ = kStreamingDecodeWaits; }

    void enqueue(Request request);
    bool idle() const;
    // One round: admit queued requests into free slots, build one batch, decode, sample,
    // retire finished slots.
    void step();
    // Ends every queued and running request with finish_reason "cancelled" and removes
    // their KV. Never throws.
    void cancel_all() noexcept;
    // Ends a request that never got a slot (its on_done gets an empty completion).
    static void complete_unstarted(Request & request, FinishReason reason, const std::string & error);

private:
    struct Slot;

    void reap_cancelled();
    void choose_sampler(Slot & slot, const GenerateParams & params, uint32_t seed);
    void admit();
    void share_prefixes();
    size_t pair(const Slot & a, const Slot & b) const;
    void emit_text(Slot & slot, bool final);
    void decode_group(std::vector<Slot *> group);
    void sample(const std::vector<Slot *> & slots);
    void accept_token(Slot & slot, llama_token token, float logprob);
    void finish(Slot & slot, FinishReason reason, const std::string & error = std::string());

    const Model & model_;
    llama_context * ctx_;
    llama_memory_t mem_;
    llama_batch & batch_;
    int32_t n_batch_;
    int32_t n_ctx_seq_;
    Stats & stats_;
    TaskPool * pool_;
    DeviceSampling * device_;
    std::vector<float> split_maxima_;  // whole rows' block maxima when a step splits them (sample)
    bool share_prefixes_;
    std::vector<size_t> common_;  // [a * n_parallel + b]: common leading prompt tokens of active slots a, b
    std::vector<std::unique_ptr<Slot>> slots_;
    std::deque<Request> queue_;
    size_t prefill_rotation_ = 0;  // which slot's prompt goes first, for fairness
    size_t max_padded_gap_;        // longest run of idle slots between decoding ones to pad
    bool prompts_first_;           // waiting prompts may take a whole batch (GPU)
    int32_t max_decode_waits_ = std::numeric_limits<int32_t>::max();
    int32_t decode_waits_ = 0;     // steps in a row the decoding slots have waited
};

}  // namespace fastpar
