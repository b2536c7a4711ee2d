#include "core/loop/wake_pipe.hpp"

#include <cerrno>
#include <fcntl.h>
#include <system_error>
#include <unistd.h>

namespace fastpar {

namespace {

void set_flags(int fd) {
    // Non-blocking: neither end may ever stall its thread; close-on-exec: no child inherits it.
    if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) != 0 || fcntl(fd, F_SETFD, FD_CLOEXEC) != 0) {
        throw std::system_error(errno, std::generic_category(), "fcntl on the wake pipe");
    }
}

}  // namespace

WakePipe::WakePipe() {
    int fds[2];
    if (pipe(fds) != 0) {
        throw std::system_error(errno, std::generic_category(), "pipe for waking an event loop");
    }
    read_fd_ = fds[0];
    write_fd_ = fds[1];
    try {
        set_flags(read_fd_);
        set_flags(write_fd_);
    } catch (...) {
        close(read_fd_);
        close(write_fd_);
        throw;
    }
}

WakePipe::~WakePipe() {
    close(read_fd_);
    close(write_fd_);
}

void WakePipe::post(uint64_t token) {
    bool ring;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (posted_.insert(token).second) {
            tokens_.push_back(token);
        }
        ring = !armed_;
        armed_ = true;
    }
    if (ring) {
        const char byte = 1;
        // EAGAIN cannot happen with one byte at a time; a failure here loses no token (the
        // next drain still returns it), only this wake-up.
        while (write(write_fd_, &byte, 1) < 0 && errno == EINTR) {
        }
    }
}

std::vector<uint64_t> WakePipe::drain() {
    // The pipe first, the tokens after: a post between the two finds armed_ still set and
    // adds its token to those taken here; a post after them writes a byte of its own.
    char buf[64];
    for (;;) {
        const ssize_t n = read(read_fd_, buf, sizeof buf);
        if (n > 0 || (n < 0 && errno == EINTR)) {
            continue;
        }
        break;  // empty (EAGAIN)
    }
    std::vector<uint64_t> out;
    std::lock_guard<std::mutex> lock(mutex_);
    out.swap(tokens_);
    posted_.clear();
    armed_ = false;
    return out;
}

}  // namespace fastpar
