// A small fixed pool of threads for data-parallel loops on the scheduler's thread
// (sampling many sequences on the host at once). The caller works too, and run()
// returns when every item is done.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace fastpar {

class TaskPool {
public:
    // n_workers threads besides the caller; 0 makes run() a plain loop.
    explicit TaskPool(int32_t n_workers);
    ~TaskPool();
    TaskPool(const TaskPool &) = delete;
    TaskPool & operator=(const TaskPool &) = delete;

    // fn(i) for every i in [0, n), spread over the workers and the caller. The first
    // exception any call throws is rethrown here, after all calls have ended.
    void run(size_t n, const std::function<void(size_t)> & fn);
    int32_t n_threads() const { return static_cast<int32_t>(workers_.size()) + 1; }

private:
    void work();
    void drain();

    std::vector<std::thread> workers_;
    std::mutex mutex_;
    std::condition_variable wake_, done_;
    const std::function<void(size_t)> * fn_ = nullptr;
    size_t n_items_ = 0;
    std::atomic<size_t> next_{0};
    size_t n_busy_ = 0;
    uint64_t generation_ = 0;
    bool stop_ = false;
    std::exception_ptr error_;
};

}  // namespace fastpar
