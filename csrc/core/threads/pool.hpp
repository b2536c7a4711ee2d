// A small fixed pool of threads for data-parallel loops on the scheduler's thread
// (sampling many sequences on the host at once). The caller works too, and run()
// returns when every item is done.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace fastpar {

class TaskPool {
public:
    // How run() hands items out and waits: the defaults on a CPU, for_gpu_output() with
    // the output layer on a GPU (StepPolicy).
    struct Options {
        // Once its own items are done, the caller polls for the workers' last ones this
        // many microseconds before it sleeps on the condition variable (0: sleeps at once).
        int32_t caller_spin_us = 0;
        // For runs that come at a steady pace (one a generation step): after a run, as
        // many workers as it needed wake by themselves this many microseconds before the
        // next run is due (as long after this one's start as this one started after the
        // last's) and poll for it until as long after it is due, then sleep as usual. A
        // sleeping worker takes tens of microseconds to run once woken, on some machines
        // more than its items take; this spends up to twice anticipate_us of each such
        // worker's time a run to save that. 0: off (workers sleep until a run wakes them).
        int32_t anticipate_us = 0;

        // With the output layer on a GPU: the pool's cores are idle while a step runs
        // there, and a step takes milliseconds, so workers wake 200 us before the next
        // step's sampling is due and poll for it, and the caller polls 100 us for their
        // last rows before it sleeps. (On a CPU they would take cores from llama.cpp's own
        // threads, so a CPU Context keeps the defaults.)
        static Options for_gpu_output() {
            Options options;
            options.anticipate_us = 200;
            options.caller_spin_us = 100;
            return options;
        }
    };

    // n_workers threads besides the caller; 0 makes run() a plain loop.
    explicit TaskPool(int32_t n_workers) : TaskPool(n_workers, Options{}) {}
    TaskPool(int32_t n_workers, Options options);
    ~TaskPool();
    TaskPool(const TaskPool &) = delete;
    TaskPool & operator=(const TaskPool &) = delete;

    // fn(i) for every i in [0, n), spread over the workers and the caller. Returns when
    // every item is done, without waiting for workers that woke too late to take one (a
    // small loop is often done before the last of many threads is scheduled). The first
    // exception any call throws is rethrown here, after all calls have ended.
    void run(size_t n, const std::function<void(size_t)> & fn);
    int32_t n_threads() const { return static_cast<int32_t>(workers_.size()) + 1; }

private:
    // One run's items. Workers hold it by shared_ptr: one that wakes after its run has
    // returned finds no item left and never touches `fn`.
    struct Job {
        const std::function<void(size_t)> * fn = nullptr;
        size_t n = 0;
        std::atomic<size_t> next{0};
        std::atomic<size_t> done{0};
        std::exception_ptr error;  // under the pool's mutex
    };

    using Clock = std::chrono::steady_clock;

    void work(size_t index);
    void drain(Job & job);
    // Whether a worker that last took run `seen` has something new: a run, or the stop.
    bool posted(uint64_t seen) const { return stop_.load() || generation_.load() != seen; }
    // anticipate_us: the worker's wait for the next run, woken early and polling.
    void anticipate(std::unique_lock<std::mutex> & lock, size_t index, uint64_t seen, uint64_t & anticipated);

    Options options_;
    std::vector<std::thread> workers_;
    std::mutex mutex_;
    std::condition_variable wake_, done_;
    std::shared_ptr<Job> job_;  // the run under way, if any
    // Written under the mutex; atomic so that polling workers can read it without.
    std::atomic<uint64_t> generation_{0};
    std::atomic<bool> stop_{false};
    // anticipate_us, under the mutex: when the last run started, and for the next one,
    // the workers 0 .. n_anticipate_ - 1 wake at wake_at_ and poll until poll_until_;
    // each does so once a run (anticipation_ counts the runs that set them).
    Clock::time_point last_start_{};
    bool have_last_start_ = false;
    Clock::time_point wake_at_{}, poll_until_{};
    size_t n_anticipate_ = 0;
    uint64_t anticipation_ = 0;
};

}  // namespace fastpar
