// The one loop (docs/design.md): n_parallel slots over one llama_context, a FIFO of pending
// requests, and one llama_batch reused for every step. generate_parallel drives it on
// the calling thread; nothing else decodes.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/sampling/device_sampling.hpp"
#include "core/model/model.hpp"
#include "core/base/params.hpp"
#include "core/base/results.hpp"
#include "core/threads/pool.hpp"
#include "core/loop/prefix_cache.hpp"
#include "core/loop/prefix_sharing.hpp"
#include "core/sampling/sampling.hpp"
#include "core/loop/step_plan.hpp"
#include "core/loop/step_policy.hpp"
#include "core/structured/structured.hpp"
#include "core/threads/thread_governor.hpp"
#include "core/sampling/token_chooser.hpp"
#include "llama.h"

namespace fastpar {

using Clock = std::chrono::steady_clock;

struct Suspended;  // slot.hpp

struct Request {
    Prompt prompt;
    std::shared_ptr<const GenerateParams> params;
    uint32_t seed = 0;                           // resolved sampler seed
    // Samples of one prompt (GenerateParams::n > 1) carry the same nonzero group: they
    // copy the prompt's KV cache from one another (StepPolicy::share_samples). 0 = none.
    uint64_t group = 0;
    // An embeddings context's request (Context::embed): its options; generation ignores them.
    EmbedParams embed;
    std::function<void(Completion &&)> on_done;  // called once, on the scheduler's thread
    std::function<void()> on_start;              // optional: called when it gets a slot
    // Optional: called with each new piece of text (valid UTF-8, never the start of a
    // possible stop string) as it is generated; the pieces add up to Completion::text.
    std::function<void(const std::string &)> on_text;
    // Optional: set from any thread to cancel; the scheduler notices between steps.
    std::shared_ptr<std::atomic<bool>> cancel;
    Clock::time_point t_submit = Clock::now();
    // Set while a preempted request waits to resume (slot.hpp); null otherwise.
    std::shared_ptr<Suspended> suspended;

    // GenerateParams::priority (lower is more urgent), 0 without params.
    int32_t priority() const { return params ? params->priority : 0; }
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

struct SchedulerOptions {
    int32_t n_parallel = 1;
    int32_t n_batch = 1;    // most tokens a step decodes, >= n_parallel
    int32_t n_ctx_seq = 0;  // positions one sequence may use
    StepPolicy policy;
    // Chooses tokens of many sequences on the host at once; may be null.
    TaskPool * pool = nullptr;
    // With it (kept by the context), rows of logits are cut down to their best candidates
    // inside the graph for every request whose chain can start from them
    // (DeviceSampling::serves); the others get whole rows. May be null.
    DeviceSampling * device = nullptr;
    // Adapts llama.cpp's thread count to the CPUs this process gets (kept by the context);
    // may be null.
    ThreadGovernor * threads = nullptr;
    // Compiled constraints and their allowed-token sets (kept by the context, so that later
    // calls with the same schema start warm); required.
    GrammarCache * grammars = nullptr;
    // What finished requests left in the KV cache, across calls (kept by the context); null:
    // every slot's sequence is removed when its request ends.
    PrefixCache * cache = nullptr;
    // An embeddings context (ContextParams::embeddings): every request is a text to embed,
    // decoded whole in one step (step_embeddings); n_batch is then one physical batch.
    bool embeddings = false;
    // The floats of each text's pooled vector (Context::embedding_size).
    int32_t embedding_size = 0;
    // Tokens an embeddings step packs texts up to (0: n_batch); the oldest text, when longer,
    // sets it for its step. A step's texts attend over all its tokens (masked), so attention
    // grows with the step's size (params.hpp: kCpuEmbedStep, kGpuEmbedStep).
    int32_t embed_step_tokens = 0;
};

struct Slot;  // slot.hpp

// What a failed llama_decode's return code means, for the request that ends with it.
std::string decode_error_message(int32_t rc);

class Scheduler {
public:
    // `batch` must hold at least options.n_batch tokens; every choice that differs between
    // a CPU and a GPU comes in options.policy (step_policy.hpp).
    Scheduler(const Model & model, llama_context * ctx, llama_batch & batch, const SchedulerOptions & options,
              Stats & stats);
    // Cancels whatever is still queued or running, so the context is left clean.
    ~Scheduler();
    Scheduler(const Scheduler &) = delete;
    Scheduler & operator=(const Scheduler &) = delete;

    void enqueue(Request request);
    bool idle() const;
    // One round: admit queued requests into free slots, build one batch, decode, sample,
    // retire finished slots.
    void step();
    // Ends every queued and running request with finish_reason "cancelled" and removes
    // their KV. Never throws.
    void cancel_all() noexcept;
    // Ends a request that is not in a slot: one that never got one gets an empty completion,
    // a suspended one what it had generated.
    static void complete_unstarted(Request & request, FinishReason reason, const std::string & error);

private:
    void reap_cancelled();
    void choose_sampler(Slot & slot, const GenerateParams & params, uint32_t seed);
    void admit();  // admit.hpp has its parts
    bool urgent_queued() const;  // the queue's first request more urgent than a running one
    // Preemption (preempt.cpp): a queued request more urgent than a running one takes its
    // slot; the running one is suspended and resumed later where it stopped.
    void preempt();
    // Keeping the running sequences in the first slots (compact.cpp, StepPolicy::compact_slots).
    void compact();
    bool vacate_held(size_t seq);
    void move_sequence(size_t from, size_t to);
    void suspend(Slot & slot);
    void resume(Request request);
    void requeue_first(Request request);
    Slot & pick_slot(const std::vector<llama_token> & tokens, bool reuses);
    size_t cached_for(const std::vector<llama_token> & prompt, size_t longest) const;
    void reuse_cached(Slot & slot);
    size_t tiled_suffix_start(size_t n_cached, size_t n_prompt) const;
    bool drop_idle_holds();
    void pair_for_sharing(Slot & slot);
    void share_prefixes();
    void emit_text(Slot & slot);
    void decode_group(std::vector<Slot *> group);
    llama_pos pad_position(const Slot & s) const;
    // An embeddings context's step (embed_step.cpp): whole texts, oldest first, as many as
    // one batch holds; each pooled vector read back and the text finished.
    void step_embeddings();
    void decode_embeddings(std::vector<Slot *> group);
    // Why an embeddings context cannot take this text of n_tokens tokens, or "" when it can.
    std::string embedding_refusal(const Prompt & prompt, size_t n_tokens) const;
    bool retire_scored();
    void sample(const std::vector<Slot *> & slots);
    void accept_token(Slot & slot, llama_token token, float logprob, std::vector<std::pair<llama_token, float>> & top);
    void finish(Slot & slot, FinishReason reason, const std::string & error = std::string());

    const Model & model_;
    llama_context * ctx_;
    ThreadGovernor * threads_;
    llama_memory_t mem_;
    llama_batch & batch_;
    int32_t n_batch_;
    int32_t n_ctx_seq_;
    Stats & stats_;
    TaskPool * pool_;
    DeviceSampling * device_;
    StepPolicy policy_;
    TokenChooser chooser_;
    GrammarCache & grammars_;  // json_schema and grammar constraints, compiled once each
    PrefixCache * cache_;      // may be null
    PrefixSharing sharing_;  // for no slot unless policy_.share_prefixes or share_samples
    std::vector<SharingView> sharing_views_;  // reused each step
    std::vector<PlanInput> plan_inputs_;       // reused each step
    StepPlan plan_;                           // reused each step
    std::vector<std::unique_ptr<Slot>> slots_;
    std::deque<Request> queue_;
    int32_t decode_waits_ = 0;     // steps in a row the decoding slots have waited
    bool embeddings_ = false;      // SchedulerOptions::embeddings
    int32_t embedding_size_ = 0;   // SchedulerOptions::embedding_size
    int32_t embed_step_tokens_ = 0;  // SchedulerOptions::embed_step_tokens, resolved
    uint64_t n_admitted_ = 0;      // requests admitted so far: each slot's Slot::order
    // stats_.n_decode_calls when a free slot began to wait for its wave; -1: none waits.
    int64_t wave_hold_from_ = -1;
};

}  // namespace fastpar
