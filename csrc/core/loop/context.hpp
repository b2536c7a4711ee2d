// A llama_context with n_parallel slots, its one llama_batch, and the lock that makes
// concurrent generate calls on one Context take turns.
#pragma once

#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "core/model/model.hpp"
#include "core/base/params.hpp"
#include "core/base/results.hpp"
#include "core/threads/pool.hpp"
#include "core/loop/prefix_cache.hpp"
#include "core/loop/scheduler.hpp"
#include "core/loop/step_policy.hpp"
#include "core/threads/thread_governor.hpp"
#include "llama.h"

namespace fastpar {

class Context {
public:
    // Throws InvalidArgument for bad params, Error when llama.cpp cannot make the context.
    Context(std::shared_ptr<const Model> model, const ContextParams & params);
    ~Context();
    Context(const Context &) = delete;
    Context & operator=(const Context &) = delete;

    // Runs every prompt to completion and returns results in input order. A prompt that
    // cannot be served ends with FinishReason::Error; the others are unaffected.
    // `interrupt` is polled between steps: when it returns true, every unfinished prompt
    // is cancelled, the KV cache is cleared and Interrupted is thrown. Concurrent calls
    // on one Context are serialised.
    // `on_completion(i, completion)`, when given, is called as each prompt finishes.
    std::vector<Completion> generate(const std::vector<Prompt> & prompts, const GenerateParams & params,
                                     const std::function<bool()> & interrupt = {},
                                     const std::function<void(size_t, const Completion &)> & on_completion = {});
    // The same with parameters per prompt: `params` holds one entry for every prompt, or
    // one for all. A prompt with n > 1 gets n completions, sample j seeded seed + j; the
    // result holds every prompt's samples in turn (prompt-major, sample order), and
    // `on_completion` gets that flat index. The prompt is decoded once and its KV cache
    // copied to its other samples (StepPolicy::share_samples). A seed of -1 is drawn once
    // per entry of `params`: with one entry for all, every prompt gets the same seed.
    std::vector<Completion> generate(const std::vector<Prompt> & prompts, const std::vector<GenerateParams> & params,
                                     const std::function<bool()> & interrupt = {},
                                     const std::function<void(size_t, const Completion &)> & on_completion = {});

    // Embeds every text (an embeddings context only: ContextParams::embeddings): each result's
    // `embedding` holds its pooled vector, results in input order. A text that cannot be
    // embedded (empty, longer than one batch, a decode that fails) ends with
    // FinishReason::Error alone; the others are unaffected. `interrupt` and `on_completion`
    // as for generate.
    std::vector<Completion> embed(const std::vector<Prompt> & prompts, const EmbedParams & params,
                                  const std::function<bool()> & interrupt = {},
                                  const std::function<void(size_t, const Completion &)> & on_completion = {});

    // Gives `body` a Scheduler over this context, with exclusive use of it until `body`
    // returns (the Engine's worker holds it for its whole life). Whatever the scheduler
    // still holds afterwards, even after an exception, is cancelled and its KV removed.
    void with_scheduler(Stats & stats, const std::function<void(class Scheduler &)> & body);
    // The same with another policy than the context's (the Engine's streaming limit);
    // its pool options are the context's, fixed when the pool was made.
    void with_scheduler(Stats & stats, const StepPolicy & policy, const std::function<void(class Scheduler &)> & body);
    // The step policy resolved for this context's model and options (step_policy.hpp).
    const StepPolicy & step_policy() const { return policy_; }
    // Makes a running llama_decode return early (llama.cpp's abort callback; CPU backend).
    void set_abort(bool abort) { abort_.store(abort); }

    Stats last_stats() const;
    // The prefix cache's counts (thread-safe); all zero with prefix_cache_mib = 0.
    PrefixCacheStats prefix_cache_stats() const;
    // Empties the prefix cache: every slot's KV and every host entry. Waits for a running
    // generate call to end.
    void clear_prefix_cache();
    // The same, for code already inside with_scheduler's body, between steps.
    void clear_prefix_cache_unlocked();
    // Writes the prefix cache to its folder (ContextParams::prefix_cache_dir; done anyway when
    // the context is freed). Waits for a running generate call to end.
    void save_prefix_cache();
    // llama_memory_seq_pos_max for every slot: all -1 when nothing is held (the prefix
    // cache off or cleared).
    std::vector<int32_t> seq_pos_max() const;
    // The same, for code already inside with_scheduler's body (which holds the lock).
    std::vector<int32_t> seq_pos_max_unlocked() const;

    const ContextParams & params() const { return params_; }
    // Positions one sequence may really use (n_ctx_per_seq, or less if llama.cpp gave less).
    int32_t n_ctx_per_seq() const { return n_ctx_seq_; }
    int32_t n_threads() const { return n_threads_; }
    // Whether rows of logits are cut down on the device (DeviceSampling): device_sampling
    // asks for it (or, auto, the output layer runs on a GPU) and the vocabulary splits
    // into blocks.
    bool device_sampling() const;
    // Whether creation ran the warm-up decodes (ContextParams::warmup; auto: any layer on a GPU).
    bool warmed_up() const { return warmed_up_; }
    const std::shared_ptr<const Model> & model() const { return model_; }
    // An embeddings context's pooling as used ("mean", "cls", "last" or "rank": the one asked
    // for, else the model's, else mean); "" for a generation context.
    const std::string & pooling() const { return pooling_; }
    // The length of an embedding vector: llama_model_n_embd_out, or with "rank" pooling the
    // classification head's outputs (llama_model_n_cls_out; the score is the first).
    int32_t embedding_size() const;

private:
    // fastpar._testing's probes (csrc/testing/probes.hpp) set the step policy and the grammar
    // cache's option; nothing of them is in libfastpar.
    friend struct ContextTesting;

    void warm_up();
    void release();  // frees the llama.cpp context and batch (the destructor's work)
    // The most tokens one step may hold: n_batch, but never more than the context holds (as
    // llama.cpp clamps its own), so a huge n_batch does not size the batch buffers.
    int32_t steps_n_batch() const { return std::min(params_.n_batch, params_.n_parallel * params_.n_ctx_per_seq); }

    std::shared_ptr<const Model> model_;
    ContextParams params_;
    llama_context * ctx_ = nullptr;
    llama_batch batch_{};
    int32_t n_ctx_seq_ = 0;
    int32_t n_threads_ = 0;
    mutable std::mutex mutex_;  // one generate at a time
    mutable std::mutex stats_mutex_;
    Stats last_stats_;
    std::atomic<bool> abort_{false};
    StepPolicy policy_;
    std::unique_ptr<TaskPool> pool_;
    std::unique_ptr<ThreadGovernor> governor_;
    // Compiled json_schema/grammar constraints and their allowed-token sets, across calls.
    std::unique_ptr<GrammarCache> grammars_;
    // Device sampling (null: off), with which slots have its chain attached, kept across
    // calls; ~Context detaches them before it frees ctx_.
    std::unique_ptr<DeviceSampling> device_;
    // What finished requests left in the KV cache, across calls; null when off.
    std::unique_ptr<PrefixCache> cache_;
    bool warmed_up_ = false;
    std::string pooling_;
};

}  // namespace fastpar
