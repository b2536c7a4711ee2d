// A pipe that the engine's thread writes to when requests have news, for an event loop to
// watch (asyncio's add_reader). The engine's thread never runs the loop's code, so it never
// waits for Python's GIL: with a listener per request it took the GIL once per piece, and a
// busy event loop held the whole step up (docs/internals.md, "The HTTP server").
#pragma once

#include <cstdint>
#include <mutex>
#include <unordered_set>
#include <vector>

namespace fastpar {

class WakePipe {
public:
    WakePipe();  // throws std::system_error when no pipe can be made
    ~WakePipe();
    WakePipe(const WakePipe &) = delete;
    WakePipe & operator=(const WakePipe &) = delete;

    // The end to watch for reading.
    int fileno() const { return read_fd_; }
    // Any thread: `token` has news. At most one byte waits in the pipe at a time, so a
    // reader that falls behind never blocks the writer.
    void post(uint64_t token);
    // The reader: empties the pipe, then returns each token posted since the last drain
    // once, in the order first posted. A post after the pipe was emptied writes a new byte.
    std::vector<uint64_t> drain();

private:
    std::mutex mutex_;
    std::vector<uint64_t> tokens_;
    std::unordered_set<uint64_t> posted_;
    bool armed_ = false;  // a byte is in the pipe for the tokens held
    int read_fd_ = -1;
    int write_fd_ = -1;
};

}  // namespace fastpar
