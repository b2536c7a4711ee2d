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

void TaskPool::drain() {
    for (size_t i = next_.fetch_add(1); i < n_items_; i = next_.fetch_add(1)) {
        try {
            (*fn_)(i);
        } catch (...) {
            std::lock_guard<std::mutex> lock(mutex_);
            if (!error_) {
                error_ = std::current_exception();
            }
        }
    }
}

void TaskPool::work() {
    uint64_t seen = 0;
    for (;;) {
        {
            std::unique_lock<std::mutex> lock(mutex_);
            wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
            if (stop_) {
                return;
            }
            seen = generation_;
        }
        drain();
        {
            std::lock_guard<std::mutex> lock(mutex_);
            --n_busy_;
        }
        done_.notify_one();
    }
}

void TaskPool::run(size_t n, const std::function<void(size_t)> & fn) {
    if (workers_.empty() || n < 2) {
        for (size_t i = 0; i < n; ++i) {
            fn(i);
        }
        return;
    }
    {
        std::lock_guard<std::mutex> lock(mutex_);
        fn_ = &fn;
        n_items_ = n;
        next_.store(0);
        n_busy_ = workers_.size();
        error_ = nullptr;
        ++generation_;
    }
    wake_.notify_all();
    drain();
    std::exception_ptr error;
    {
        std::unique_lock<std::mutex> lock(mutex_);
        done_.wait(lock, [&] { return n_busy_ == 0; });
        fn_ = nullptr;
        error = error_;
        error_ = nullptr;
    }
    if (error) {
        std::rethrow_exception(error);
    }
}

}  // namespace fastpar
