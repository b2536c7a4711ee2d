#include "core/pool.hpp"

namespace fastpar {

TaskPool::TaskPool(int32_t n_workers) {
    for (int32_t i = 0; i < n_workers; ++i) {
        workers_.emplace_back([this] { work(); });
    }
}

TaskPool::~TaskPool() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stop_ = true;
    }
    wake_.notify_all();
    for (auto & t : workers_) {
        t.join();
    }
}

void TaskPool::drain(Job & job) {
    for (size_t i = job.next.fetch_add(1); i < job.n; i = job.next.fetch_add(1)) {
        try {
            (*job.fn)(i);
        } catch (...) {
            std::lock_guard<std::mutex> lock(mutex_);
            if (!job.error) {
                job.error = std::current_exception();
            }
        }
        if (job.done.fetch_add(1) + 1 == job.n) {
            // The last item: run() may be waiting. Taking the lock orders this with its
            // check of `done`, so the wake-up cannot be missed.
            std::lock_guard<std::mutex> lock(mutex_);
            done_.notify_all();
        }
    }
}

void TaskPool::work() {
    uint64_t seen = 0;
    for (;;) {
        std::shared_ptr<Job> job;
        {
            std::unique_lock<std::mutex> lock(mutex_);
            wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
            if (stop_) {
                return;
            }
            seen = generation_;
            job = job_;
        }
        if (job) {
            drain(*job);
        }
    }
}

void TaskPool::run(size_t n, const std::function<void(size_t)> & fn) {
    if (workers_.empty() || n < 2) {
        for (size_t i = 0; i < n; ++i) {
            fn(i);
        }
        return;
    }
    auto job = std::make_shared<Job>();
    job->fn = &fn;
    job->n = n;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        job_ = job;
        ++generation_;
    }
    wake_.notify_all();
    drain(*job);
    std::exception_ptr error;
    {
        std::unique_lock<std::mutex> lock(mutex_);
        done_.wait(lock, [&] { return job->done.load() == n; });
        job_.reset();
        error = job->error;
    }
    if (error) {
        std::rethrow_exception(error);
    }
}

}  // namespace fastpar
