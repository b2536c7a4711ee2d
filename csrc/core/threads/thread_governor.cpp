#include "core/threads/thread_governor.hpp"

#include <dirent.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "llama.h"

namespace fastpar {

ThreadGovernor::ThreadGovernor(int32_t max_threads, bool adapt)
    : max_threads_(std::max(1, max_threads)), threads_(std::max(1, max_threads)), adapt_(adapt && max_threads > 1) {}

int32_t ThreadGovernor::decide(int32_t threads, int32_t max_threads, double waited, double since_change_s) {
    if (waited > kWaitedHigh && threads > 1) {
        // The threads ran (1 - waited) of the time they wanted: keep as many as that.
        const auto kept = static_cast<int32_t>(std::lround(threads * (1.0 - std::min(waited, 1.0))));
        return std::clamp(kept, 1, threads - 1);
    }
    if (threads < max_threads && waited < kWaitedHigh / 2 && since_change_s >= kProbeAfterS) {
        return threads + 1;
    }
    return threads;
}

int64_t ThreadGovernor::waited_ns() {
    DIR * dir = opendir("/proc/self/task");
    if (dir == nullptr) {
        return -1;
    }
    int64_t sum = 0;
    bool any = false;
    while (const dirent * e = readdir(dir)) {
        if (e->d_name[0] == '.') {
            continue;
        }
        const std::string path = std::string("/proc/self/task/") + e->d_name + "/schedstat";
        FILE * f = std::fopen(path.c_str(), "r");
        if (f == nullptr) {
            continue;  // a thread that just ended
        }
        unsigned long long on_cpu = 0;
        unsigned long long waiting = 0;
        if (std::fscanf(f, "%llu %llu", &on_cpu, &waiting) == 2) {
            sum += static_cast<int64_t>(waiting);
            any = true;
        }
        std::fclose(f);
    }
    closedir(dir);
    return any ? sum : -1;
}

void ThreadGovernor::after_decode(llama_context * ctx) {
    if (!adapt_) {
        return;
    }
    const auto now = Clock::now();
    if (!window_open_) {
        window_waited_ns_ = waited_ns();
        if (window_waited_ns_ < 0) {
            adapt_ = false;
            return;
        }
        window_open_ = true;
        window_start_ = now;
        last_change_ = now;
        return;
    }
    const double dt = std::chrono::duration<double>(now - window_start_).count();
    if (dt < kWindowS) {
        return;
    }
    const int64_t w = waited_ns();
    if (w < 0) {
        adapt_ = false;
        return;
    }
    const double waited = static_cast<double>(w - window_waited_ns_) * 1e-9 / (dt * threads_);
    const int32_t next = decide(threads_, max_threads_, waited,
                                std::chrono::duration<double>(now - last_change_).count());
    if (next != threads_) {
        threads_ = next;
        llama_set_n_threads(ctx, next, next);
        last_change_ = now;
    }
    window_start_ = now;
    window_waited_ns_ = w;
}

}  // namespace fastpar
