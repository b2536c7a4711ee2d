#include "core/loop/engine.hpp"

#include <future>

#include "core/loop/requests.hpp"

namespace fastpar {
namespace {

// A burst of submissions (a loop over a list of prompts) arrives microseconds apart. An idle
// engine that started a step on the first would run the rest a step or more behind it: more
// decode calls, and steps of shapes the first wave's do not have, each building its graph
// anew, where generate_parallel starts them together. So an engine with nothing to run waits
// before its first step until the submissions pause for kBurstQuiet, at most kBurstMax; a
// lone request waits kBurstQuiet, a fraction of a percent of a first token's time.
constexpr auto kBurstQuiet = std::chrono::microseconds(200);
constexpr auto kBurstMax = std::chrono::milliseconds(5);

template <typename Lock, typename Pred>
bool wait_for(std::condition_variable & cv, Lock & lock, double timeout_s, Pred pred) {
    // Negative, infinite or absurdly long (past what a clock's time point can hold): for ever.
    if (timeout_s < 0 || !(timeout_s < 1e9)) {
        cv.wait(lock, pred);
        return true;
    }
    return cv.wait_for(lock, std::chrono::duration<double>(timeout_s), pred);
}

}  // namespace

// ---------------------------------------------------------------------------- RequestHandle

bool RequestHandle::done() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return n_finished_ == finished_.size();
}

void RequestHandle::check_sample(int32_t sample) const {
    if (sample < 0 || sample >= n_samples()) {
        throw InvalidArgument("sample " + std::to_string(sample) + " of request " + std::to_string(id_) +
                              ", which has " + std::to_string(n_samples()) + " (0 to n - 1)");
    }
}

bool RequestHandle::done(int32_t sample) const {
    check_sample(sample);
    std::lock_guard<std::mutex> lock(mutex_);
    return finished_[static_cast<size_t>(sample)] != 0;
}

std::vector<Completion> RequestHandle::result(double timeout_s) const {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!wait_for(cv_, lock, timeout_s, [this] { return n_finished_ == finished_.size(); })) {
        throw Timeout("request " + std::to_string(id_) + " did not finish within " + std::to_string(timeout_s) + " s");
    }
    return completions_;
}

Completion RequestHandle::result(int32_t sample, double timeout_s) const {
    check_sample(sample);
    const auto j = static_cast<size_t>(sample);
    std::unique_lock<std::mutex> lock(mutex_);
    if (!wait_for(cv_, lock, timeout_s, [this, j] { return finished_[j] != 0; })) {
        throw Timeout("sample " + std::to_string(sample) + " of request " + std::to_string(id_) +
                      " did not finish within " + std::to_string(timeout_s) + " s");
    }
    return completions_[j];
}

std::optional<Piece> RequestHandle::next_piece(double timeout_s) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!wait_for(cv_, lock, timeout_s, [this] { return n_finished_ == finished_.size() || !pieces_.empty(); })) {
        throw Timeout("no text from request " + std::to_string(id_) + " within " + std::to_string(timeout_s) + " s");
    }
    if (pieces_.empty()) {
        return std::nullopt;
    }
    Piece piece = std::move(pieces_.front());
    pieces_.pop_front();
    return piece;
}

std::vector<Piece> RequestHandle::take_pieces() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<Piece> out(std::make_move_iterator(pieces_.begin()), std::make_move_iterator(pieces_.end()));
    pieces_.clear();
    return out;
}

void RequestHandle::set_listener(std::function<void()> listener) {
    auto shared = std::make_shared<const std::function<void()>>(std::move(listener));
    bool already_done;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        listener_.swap(shared);  // the previous one is destroyed below, outside the lock
        already_done = n_finished_ == finished_.size();
    }
    shared.reset();
    if (already_done) {
        notify();
    }
}

void RequestHandle::set_wake(std::shared_ptr<WakePipe> pipe, uint64_t token) {
    bool already_done;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        wake_.swap(pipe);  // the previous pipe goes with `pipe`, outside the lock
        wake_token_ = token;
        already_done = n_finished_ == finished_.size();
        if (already_done && wake_) {
            wake_->post(token);  // post takes only the pipe's own lock
        }
    }
}

void RequestHandle::push_piece(int32_t sample, const std::string & piece) {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        pieces_.emplace_back(sample, piece);
    }
    cv_.notify_all();
    notify();
}

void RequestHandle::complete(int32_t sample, Completion && c) {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        const auto j = static_cast<size_t>(sample);
        completions_[j] = std::move(c);
        if (!finished_[j]) {
            finished_[j] = 1;
            ++n_finished_;
        }
    }
    cv_.notify_all();
    notify();
}

void RequestHandle::notify() {
    std::shared_ptr<const std::function<void()>> listener;
    std::shared_ptr<WakePipe> wake;
    uint64_t token;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        listener = listener_;
        wake = wake_;
        token = wake_token_;
    }
    if (wake) {
        wake->post(token);
    }
    if (listener && *listener) {
        try {
            (*listener)();
        } catch (...) {
            // A listener's failure (e.g. its event loop closed) must not stop the engine.
        }
    }
}

// ---------------------------------------------------------------------------- Engine

Engine::Engine(std::shared_ptr<const Model> model, const ContextParams & params, int32_t max_queued)
    : Engine(std::make_unique<Context>(std::move(model), params), max_queued, std::nullopt) {}

Engine::Engine(std::unique_ptr<Context> ctx, int32_t max_queued, std::optional<StepPolicy> policy)
    : ctx_(std::move(ctx)),
      max_queued_(max_queued),
      policy_(policy ? *policy : streaming_step_policy(ctx_->step_policy())) {
    // With no place in the queue, a request could never wait for a slot.
    if (max_queued < 1) {
        throw InvalidArgument("max_queued must be >= 1, got " + std::to_string(max_queued));
    }
    worker_ = std::thread([this] { run(); });
}

Engine::~Engine() { close(); }

bool Engine::closed() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return closing_;
}

bool Engine::has_room(int32_t n) const {
    // Requests about to take a free slot are not queued: the queue is full only when the
    // unfinished requests fill every slot and max_queued places besides.
    return n_unfinished_ + n <= static_cast<int64_t>(ctx_->params().n_parallel) + max_queued_;
}

std::shared_ptr<RequestHandle> Engine::submit(Prompt prompt, const GenerateParams & params, double timeout_s) {
    if (ctx_->params().embeddings) {
        throw InvalidArgument("this engine was made for embeddings (embeddings=True): submit texts with "
                              "submit_embedding, or make one without it to generate");
    }
    AdmittedParams admitted = admit_params(params);
    check_prompt(*ctx_->model(), prompt);
    apply_tools(*ctx_->model(), prompt, admitted);
    const int32_t n = params.n;
    const int64_t capacity = static_cast<int64_t>(ctx_->params().n_parallel) + max_queued_;
    if (n > capacity) {
        // The samples are queued together: more than the engine holds would never fit.
        throw InvalidArgument("n=" + std::to_string(n) + " samples, but the engine holds at most " +
                              std::to_string(capacity) + " requests (n_parallel + max_queued)");
    }
    // The request's id is its samples' group: unique among the requests the scheduler holds.
    return enqueue(n, timeout_s, [&](uint64_t id) { return fan_out(std::move(prompt), admitted, id, Clock::now()); });
}

std::shared_ptr<RequestHandle> Engine::submit_embedding(Prompt prompt, const EmbedParams & params, double timeout_s) {
    if (!ctx_->params().embeddings) {
        throw InvalidArgument("this engine was made for generation: make one with embeddings=True to embed");
    }
    check_prompt(*ctx_->model(), prompt);
    return enqueue(1, timeout_s, [&](uint64_t) {
        std::vector<Request> one(1);
        one[0].prompt = std::move(prompt);
        one[0].params = std::make_shared<const GenerateParams>();
        one[0].embed = params;
        one[0].t_submit = Clock::now();
        return one;
    });
}

std::shared_ptr<RequestHandle> Engine::enqueue(int32_t n, double timeout_s,
                                               const std::function<std::vector<Request>(uint64_t)> & make) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (timeout_s != 0) {
        wait_for(room_, lock, timeout_s, [this, n] { return closing_ || has_room(n); });
    }
    if (!failure_.empty()) {
        throw EngineClosed("the engine stopped after a failure: " + failure_ +
                           "; create a new one to submit more requests");
    }
    if (closing_) {
        throw EngineClosed("the engine is closed; create a new one to submit more requests");
    }
    if (!has_room(n)) {
        throw QueueFull("the engine's queue is full: " + std::to_string(n_waiting_) +
                        " requests wait for a slot (max_queued=" + std::to_string(max_queued_) + ")" +
                        (timeout_s != 0 ? " and none freed up in time" : "") +
                        "; retry later, submit with block=True, or raise max_queued");
    }
    const uint64_t id = next_id_++;
    auto handle = std::make_shared<RequestHandle>(id, n);
    std::vector<Request> samples = make(id);
    const bool streams = !ctx_->params().embeddings;
    for (size_t j = 0; j < samples.size(); ++j) {
        Request & request = samples[j];
        const auto sample = static_cast<int32_t>(j);
        request.cancel = handle->cancel_;
        if (streams) {
            request.on_text = [handle, sample](const std::string & piece) { handle->push_piece(sample, piece); };
        }
        // Counted exactly, on the worker, as the sample moves: waiting -> in a slot -> done.
        auto started = std::make_shared<bool>(false);
        request.on_start = [this, started] {
            std::lock_guard<std::mutex> guard(mutex_);
            *started = true;
            --n_waiting_;
        };
        request.on_done = [this, handle, started, sample](Completion && c) {
            account(c, *started, handle->cancel_->load());
            handle->complete(sample, std::move(c));
        };
        incoming_.push_back(std::move(request));
    }
    n_unfinished_ += n;
    n_waiting_ += n;
    totals_.n_submitted += n;
    cv_.notify_all();
    return handle;
}

void Engine::account(Completion & c, bool started, bool cancelled) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!failure_.empty() && c.finish_reason == FinishReason::Cancelled && !cancelled) {
        // Ended by the worker's failure, not by its caller: say so.
        c.finish_reason = FinishReason::Error;
        c.error = failure_;
    }
    --n_unfinished_;
    room_.notify_all();
    if (!started) {
        --n_waiting_;  // finished (cancelled, failed) before it got a slot
    }
    // The loop's counters as of this completion: its caller, woken by it, may read stats()
    // before the step that made it returns (on the worker, or after it ended: close()).
    publish_loop_stats();
    totals_.n_prompt_tokens += c.n_prompt_tokens;
    totals_.n_prompt_tokens_shared += c.n_prompt_tokens_shared;
    totals_.n_prompt_tokens_cached += c.n_prompt_tokens_cached;
    totals_.n_gen_tokens += c.n_gen_tokens;
    switch (c.finish_reason) {
        case FinishReason::Error: ++totals_.n_failed; break;
        case FinishReason::Cancelled: ++totals_.n_cancelled; break;
        default: ++totals_.n_completed; break;
    }
}

void Engine::run() {
    try {
        ctx_->with_scheduler(loop_stats_, policy_, [this](Scheduler & scheduler) {
            try {
                loop(scheduler);
            } catch (const std::exception & e) {
                fail(e.what());  // before with_scheduler ends what it holds: as errors
                throw;
            } catch (...) {
                fail("unknown exception");
                throw;
            }
        });
    } catch (...) {
        // with_scheduler has ended every request it held. End those that never reached
        // it too, and answer pending queries: nobody waits for a worker that is gone.
        std::deque<Request> leftover;
        std::deque<std::function<void()>> tasks;
        {
            std::unique_lock<std::mutex> lock(mutex_);
            if (failure_.empty()) {  // the scheduler could not even be set up
                lock.unlock();
                try {
                    throw;
                } catch (const std::exception & e) {
                    fail(e.what());
                } catch (...) {
                    fail("unknown exception");
                }
                lock.lock();
            }
            leftover.swap(incoming_);
            tasks.swap(tasks_);
        }
        for (auto & request : leftover) {
            Scheduler::complete_unstarted(request, FinishReason::Error, failure_);
        }
        for (auto & task : tasks) {
            try {
                task();
            } catch (...) {
            }
        }
    }
}

void Engine::fail(const std::string & what) {
    std::lock_guard<std::mutex> lock(mutex_);
    failure_ = what.empty() ? "unknown exception" : what;
    closing_ = true;
    room_.notify_all();
}

void Engine::loop(Scheduler & scheduler) {
    for (;;) {
        std::deque<std::function<void()>> tasks;
        {
            std::unique_lock<std::mutex> lock(mutex_);
            cv_.wait(lock, [&] { return closing_ || !incoming_.empty() || !tasks_.empty() || !scheduler.idle(); });
            if (scheduler.idle() && !incoming_.empty()) {
                const auto until = Clock::now() + kBurstMax;
                for (size_t seen = incoming_.size(); Clock::now() < until; seen = incoming_.size()) {
                    if (!cv_.wait_for(lock, kBurstQuiet, [&] { return closing_ || incoming_.size() != seen; })) {
                        break;  // quiet: the burst is in
                    }
                    if (closing_) {
                        break;
                    }
                }
            }
            if (closing_) {
                return;  // with_scheduler cancels what is left
            }
            while (!incoming_.empty()) {
                scheduler.enqueue(std::move(incoming_.front()));
                incoming_.pop_front();
            }
            tasks.swap(tasks_);
        }
        for (auto & task : tasks) {
            task();
        }
        if (scheduler.idle()) {
            continue;
        }
        const auto t0 = Clock::now();
        scheduler.step();
        const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
        std::lock_guard<std::mutex> lock(mutex_);
        totals_.busy_s += dt;
        publish_loop_stats();
    }
}

void Engine::publish_loop_stats() {
    totals_.n_decode_calls = loop_stats_.n_decode_calls;
    totals_.n_padding_tokens = loop_stats_.n_padding_tokens;
    totals_.n_preempted = loop_stats_.n_preempted;
}

void Engine::post(std::function<void()> task) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closing_) {
        throw EngineClosed(failure_.empty() ? "the engine is closed" : "the engine stopped after a failure: " + failure_);
    }
    tasks_.push_back(std::move(task));
    cv_.notify_all();
}

void Engine::close() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        closing_ = true;
    }
    room_.notify_all();  // blocked submits: closed now
    ctx_->set_abort(true);  // a decode in flight returns now instead of at its end
    cv_.notify_all();
    {
        std::lock_guard<std::mutex> join_lock(join_mutex_);
        if (worker_.joinable() && worker_.get_id() != std::this_thread::get_id()) {
            worker_.join();
        }
    }
    ctx_->set_abort(false);
    try {
        ctx_->save_prefix_cache();  // to its folder, if it has one: a restart starts warm
    } catch (...) {
    }
    std::deque<Request> leftover;
    std::deque<std::function<void()>> tasks;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        leftover.swap(incoming_);
        tasks.swap(tasks_);
    }
    for (auto & request : leftover) {  // never reached the scheduler
        Scheduler::complete_unstarted(request, FinishReason::Cancelled, "");
    }
    for (auto & task : tasks) {
        task();  // answers pending queries from the (now idle) context
    }
}

EngineStats Engine::stats() const {
    std::lock_guard<std::mutex> lock(mutex_);
    EngineStats s = totals_;
    s.n_queued = n_waiting_;
    s.n_active = n_unfinished_ - n_waiting_;
    s.uptime_s = std::chrono::duration<double>(Clock::now() - t_start_).count();
    return s;
}

void Engine::clear_prefix_cache() {
    auto promise = std::make_shared<std::promise<void>>();
    auto future = promise->get_future();
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!closing_) {
            tasks_.push_back([this, promise] {
                ctx_->clear_prefix_cache_unlocked();
                promise->set_value();
            });
            cv_.notify_all();
        }
    }
    if (future.wait_for(std::chrono::seconds(0)) == std::future_status::ready || !closed()) {
        future.get();
        return;
    }
    close();  // closing: the worker has let go of the context
    ctx_->clear_prefix_cache();
}

std::vector<int32_t> Engine::seq_pos_max() {
    auto promise = std::make_shared<std::promise<std::vector<int32_t>>>();
    auto future = promise->get_future();
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!closing_) {
            // Asked on the worker, between steps: llama.cpp's memory is not read mid-decode.
            tasks_.push_back([this, promise] { promise->set_value(ctx_->seq_pos_max_unlocked()); });
            cv_.notify_all();
        }
    }
    if (future.wait_for(std::chrono::seconds(0)) == std::future_status::ready || !closed()) {
        return future.get();  // close() answers a task it finds left over
    }
    close();  // closing: wait until the worker has let go of the context
    return ctx_->seq_pos_max();
}

}  // namespace fastpar
