// How many threads llama.cpp computes with, when the user left it to fastpar.
//
// On a machine with fewer free cores than threads (another process, a busy loop, a second
// fastpar), every barrier of every graph waits for a partner thread that is not running,
// and a step takes several times as long as it would with fewer threads: two fastpar
// processes with 2 threads each on 2 cores took 3.2x their time alone, against about 2x
// with 1 thread each (docs/performance.md, "On a shared machine"). So the governor measures
// how long this process's threads were runnable but not running (Linux schedstat), and
// when that is a large share of the time they had, lowers the thread count to what they
// got; now and then it tries one more thread and keeps it only if nothing waits.
#pragma once

#include <chrono>
#include <cstdint>

struct llama_context;

namespace fastpar {

class ThreadGovernor {
public:
    // max_threads: the count to start with and never exceed. With adapt false (the user
    // chose the count) it never changes anything.
    ThreadGovernor(int32_t max_threads, bool adapt);

    // After a llama_decode on ctx: may change ctx's thread count for the next one.
    void after_decode(llama_context * ctx);
    int32_t threads() const { return threads_; }

    // The rule, on one measurement window: `waited` is the share (0..1 and more) of the
    // threads' time spent waiting for a CPU; `since_change_s` how long ago the count last
    // changed. Returns the count for the next window.
    static int32_t decide(int32_t threads, int32_t max_threads, double waited, double since_change_s);

    // A window is at least this long, so that reading schedstat costs little.
    static constexpr double kWindowS = 0.1;
    // Waiting above this share lowers the count; the share is what the threads got.
    static constexpr double kWaitedHigh = 0.2;
    // Below the maximum, one more thread is tried this long after the last change.
    static constexpr double kProbeAfterS = 2.0;

private:
    using Clock = std::chrono::steady_clock;

    // Nanoseconds all of this process's threads have waited on a run queue; -1 when the
    // kernel does not say (no /proc/<pid>/task/<tid>/schedstat): then nothing adapts.
    static int64_t waited_ns();

    int32_t max_threads_;
    int32_t threads_;
    bool adapt_;
    bool window_open_ = false;
    Clock::time_point window_start_;
    int64_t window_waited_ns_ = 0;
    Clock::time_point last_change_;
};

}  // namespace fastpar
