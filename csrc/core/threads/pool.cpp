#include "core/threads/pool.hpp"

#include <algorithm>
#include <chrono>

#if defined(__x86_64__) || defined(__i386__) || defined(_M_X64)
#include <immintrin.h>
#endif

#include "core/base/errors.hpp"

namespace fastpar {

namespace {

// Runs further apart than this are not anticipated (anticipate_us).
constexpr int kMaxPaceMs = 100;

// In a polling loop: tells the CPU so (frees a shared core's other thread meanwhile).
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__) || defined(_M_X64)
    _mm_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
}

}  // namespace

TaskPool::TaskPool(int32_t n_workers, Options options) : options_(options) {
    for (int32_t i = 0; i < n_workers; ++i) {
        workers_.emplace_back([this, i] { work(static_cast<size_t>(i)); });
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

void TaskPool::anticipate(std::unique_lock<std::mutex> & lock, size_t index, uint64_t seen, uint64_t & anticipated) {
    while (!posted(seen) && anticipated != anticipation_ && index < n_anticipate_) {
        anticipated = anticipation_;
        const Clock::time_point wake_at = wake_at_, poll_until = poll_until_;
        if (wake_.wait_until(lock, wake_at, [&] { return posted(seen); })) {
            return;
        }
        lock.unlock();
        while (!posted(seen) && Clock::now() < poll_until) {
            cpu_relax();
        }
        lock.lock();
    }
}

void TaskPool::work(size_t index) {
    uint64_t seen = 0, anticipated = 0;
    for (;;) {
        std::shared_ptr<Job> job;
        {
            std::unique_lock<std::mutex> lock(mutex_);
            if (options_.anticipate_us > 0) {
                anticipate(lock, index, seen, anticipated);
            }
            wake_.wait(lock, [&] { return posted(seen); });
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
        // On this thread alone, through the same drain: every item still runs when one throws.
        Job job;
        job.fn = &fn;
        job.n = n;
        drain(job);
        if (job.error) {
            std::rethrow_exception(job.error);
        }
        return;
    }
    auto job = std::make_shared<Job>();
    job->fn = &fn;
    job->n = n;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        job_ = job;
        generation_.fetch_add(1);
        if (options_.anticipate_us > 0) {
            // The next run is expected as long after this one as this one came after the
            // last (set now, so that the workers find it when they are done with this
            // one); a pause much longer than a generation step is not a pace to keep.
            const Clock::time_point start = Clock::now();
            const auto period = start - last_start_;
            const auto lead = std::chrono::microseconds(options_.anticipate_us);
            if (have_last_start_ && period < std::chrono::milliseconds(kMaxPaceMs)) {
                wake_at_ = start + period - lead;
                poll_until_ = start + period + lead;
                n_anticipate_ = std::min(workers_.size(), n - 1);
                ++anticipation_;
            }
            last_start_ = start;
            have_last_start_ = true;
        }
    }
    wake_.notify_all();
    drain(*job);
    if (options_.caller_spin_us > 0) {
        const auto until = Clock::now() + std::chrono::microseconds(options_.caller_spin_us);
        while (job->done.load() != n && Clock::now() < until) {
            cpu_relax();
        }
    }
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
