// The background engine: the SAME scheduler loop as generate, run on a worker thread
// that owns one Context, fed by submit() from any thread. Each request streams its text,
// can be cancelled, and carries its own timings.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/loop/context.hpp"
#include "core/base/errors.hpp"
#include "core/base/params.hpp"
#include "core/base/results.hpp"
#include "core/loop/scheduler.hpp"
#include "core/loop/wake_pipe.hpp"

namespace fastpar {

// result()/next_piece() ran out of time.
struct Timeout : Error {
    using Error::Error;
};

// submit() on an engine that was closed, or whose worker stopped after a failure.
struct EngineClosed : Error {
    using Error::Error;
};

// submit() while every slot is taken and max_queued requests already wait for one.
struct QueueFull : Error {
    using Error::Error;
};

// Counted in samples: a request of n samples (GenerateParams::n) counts n, each ending
// with its own finish reason.
struct EngineStats {
    int64_t n_active = 0;      // requests in a slot now (or suspended for a more urgent one)
    int64_t n_queued = 0;      // requests waiting for a slot
    int64_t n_submitted = 0;
    int64_t n_completed = 0;   // finished with "stop" or "length"
    int64_t n_failed = 0;      // finished with "error"
    int64_t n_cancelled = 0;
    int64_t n_prompt_tokens = 0;  // over finished requests
    int64_t n_prompt_tokens_shared = 0;
    int64_t n_prompt_tokens_cached = 0;
    int64_t n_gen_tokens = 0;     // over finished requests
    int64_t n_decode_calls = 0;
    int64_t n_padding_tokens = 0;  // throw-away tokens that kept a step in one forward pass (GPU)
    int64_t n_preempted = 0;       // running requests suspended for more urgent ones (priority)
    double uptime_s = 0;       // since the engine started
    double busy_s = 0;         // time with at least one request in a slot
    double gen_tokens_per_s() const { return busy_s > 0 ? static_cast<double>(n_gen_tokens) / busy_s : 0.0; }
};

// A piece of streamed text and the index of the sample that generated it.
using Piece = std::pair<int32_t, std::string>;

// One submitted prompt and its samples (GenerateParams::n, sample j seeded seed + j): they
// are queued, cancelled and waited for together; each streams and finishes on its own.
class RequestHandle {
public:
    RequestHandle(uint64_t id, int32_t n_samples)
        : id_(id), finished_(static_cast<size_t>(n_samples), 0), completions_(static_cast<size_t>(n_samples)) {}
    uint64_t id() const { return id_; }
    int32_t n_samples() const { return static_cast<int32_t>(completions_.size()); }
    // Asks the engine to end every sample with "cancelled" (no effect on finished ones).
    void cancel() { cancel_->store(true); }
    // Whether every sample has finished.
    bool done() const;
    // Whether sample `sample` (0 .. n_samples - 1) has finished.
    bool done(int32_t sample) const;
    // Waits for every sample's completion, in sample order; timeout_s < 0 waits for ever.
    // Throws Timeout.
    std::vector<Completion> result(double timeout_s) const;
    // Waits for one sample's completion. Throws Timeout.
    Completion result(int32_t sample, double timeout_s) const;
    // The next piece of streamed text of any sample, in the order they were generated,
    // waiting up to timeout_s (< 0: for ever); nullopt once every sample has finished and
    // every piece was taken. No piece of a sample follows its finish. Throws Timeout.
    std::optional<Piece> next_piece(double timeout_s);
    // Every piece available now, without waiting.
    std::vector<Piece> take_pieces();
    // Called on the engine's thread after each new piece and once as each sample finishes
    // (also at once if the request already finished). Exceptions from it are swallowed.
    void set_listener(std::function<void()> listener);
    // The same news as a token posted to `pipe`, without running any caller's code on the
    // engine's thread (null: none). A request may have both.
    void set_wake(std::shared_ptr<WakePipe> pipe, uint64_t token);

private:
    friend class Engine;
    void check_sample(int32_t sample) const;
    void push_piece(int32_t sample, const std::string & piece);
    void complete(int32_t sample, Completion && c);
    void notify();

    const uint64_t id_;
    std::shared_ptr<std::atomic<bool>> cancel_ = std::make_shared<std::atomic<bool>>(false);
    mutable std::mutex mutex_;
    mutable std::condition_variable cv_;
    std::deque<Piece> pieces_;
    std::vector<char> finished_;  // [sample]
    size_t n_finished_ = 0;
    std::vector<Completion> completions_;  // [sample]
    // Shared, so that notify() copies a pointer under mutex_, never the function itself:
    // copying or destroying a function that wraps a Python callable takes the GIL, and a
    // thread holding the GIL may be waiting for mutex_ (done(), take_pieces()).
    std::shared_ptr<const std::function<void()>> listener_;
    std::shared_ptr<WakePipe> wake_;
    uint64_t wake_token_ = 0;
};

class Engine {
public:
    // max_queued (>= 1): requests that may wait for a slot once every slot is taken; one
    // more is rejected at submit.
    Engine(std::shared_ptr<const Model> model, const ContextParams & params, int32_t max_queued);
    ~Engine();  // close()
    Engine(const Engine &) = delete;
    Engine & operator=(const Engine &) = delete;

    // Callable from any thread. Queues params.n samples of `prompt` at once, admitted as
    // Context::generate admits them (requests.hpp): one handle holds them all. Throws
    // InvalidArgument (bad params; n above n_parallel + max_queued), EngineClosed, QueueFull.
    // When there is no room for all n, waits up to timeout_s seconds for it (< 0: for ever;
    // 0: not at all) before QueueFull.
    std::shared_ptr<RequestHandle> submit(Prompt prompt, const GenerateParams & params, double timeout_s = 0);
    // The same for an embeddings engine (ContextParams::embeddings): one text, whose
    // Completion::embedding holds its vector; texts from any thread share steps. submit()
    // on such an engine, or this on a generating one, throws InvalidArgument.
    std::shared_ptr<RequestHandle> submit_embedding(Prompt prompt, const EmbedParams & params, double timeout_s = 0);
    // Runs `task` on the worker between steps. A task that throws stops the engine as a
    // failing step does: every request it holds ends with "error" and the exception's
    // message, and later submits throw EngineClosed naming it.
    void post(std::function<void()> task);
    // Ends queued and running requests as "cancelled" (aborting a running decode) and
    // joins the worker. Idempotent; later submits are rejected.
    void close();
    bool closed() const;
    EngineStats stats() const;
    // Empties the context's prefix cache, on the worker between steps; returns once done.
    void clear_prefix_cache();
    // llama_memory_seq_pos_max of every slot, read on the worker between steps.
    std::vector<int32_t> seq_pos_max();
    const Context & context() const { return *ctx_; }

private:
    friend struct ContextTesting;  // an engine with another step policy (a GPU's rules on a CPU)
    // The worker's step policy is `policy`, or with none streaming_step_policy of the context's.
    Engine(std::unique_ptr<Context> ctx, int32_t max_queued, std::optional<StepPolicy> policy);
    void run();
    void loop(Scheduler & scheduler);
    void fail(const std::string & what);
    bool has_room(int32_t n) const;  // room for n more requests; under mutex_
    // Queues the n requests make(id) returns under one handle (submit, submit_embedding).
    std::shared_ptr<RequestHandle> enqueue(int32_t n, double timeout_s,
                                           const std::function<std::vector<Request>(uint64_t)> & make);
    void account(Completion & c, bool started, bool cancelled);
    void publish_loop_stats();  // loop_stats_' counters into totals_: mutex_ held, on the worker

    std::unique_ptr<Context> ctx_;
    const int32_t max_queued_;
    const StepPolicy policy_;
    mutable std::mutex mutex_;
    std::condition_variable cv_;
    std::condition_variable room_;  // a request finished, or the engine closed
    std::deque<Request> incoming_;
    std::deque<std::function<void()>> tasks_;  // run on the worker between steps
    bool closing_ = false;
    // Set when the worker stopped on an exception: its message (never empty then).
    std::string failure_;
    // Counted in samples (scheduler requests): a request of n samples counts n.
    int64_t n_unfinished_ = 0;  // submitted, not yet finished
    int64_t n_waiting_ = 0;     // submitted, not yet in a slot
    uint64_t next_id_ = 1;
    EngineStats totals_;
    Stats loop_stats_;  // the scheduler's own counters (worker thread only)
    std::chrono::steady_clock::time_point t_start_ = std::chrono::steady_clock::now();
    std::mutex join_mutex_;  // close() may be called from several threads at once
    std::thread worker_;
};

}  // namespace fastpar
