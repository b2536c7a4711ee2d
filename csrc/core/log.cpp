#include "core/log.hpp"

#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "llama.h"

namespace fastpar {
namespace {

thread_local std::string t_last_error;
thread_local bool t_in_error = false;  // a CONT line continues the previous message
bool g_verbose = false;

void log_hook(ggml_log_level level, const char * text, void * /*user_data*/) {
    if (text == nullptr) {
        return;
    }
    if (level == GGML_LOG_LEVEL_ERROR) {
        t_last_error = text;
        t_in_error = true;
    } else if (level == GGML_LOG_LEVEL_CONT) {
        if (t_in_error) {
            t_last_error += text;
        }
    } else {
        t_in_error = false;
    }
    if (g_verbose) {
        std::fputs(text, stderr);
    }
}

}  // namespace

void backend_init() {
    static std::once_flag once;
    std::call_once(once, [] {
        const char * verbose = std::getenv("FASTPAR_VERBOSE");
        g_verbose = verbose != nullptr && verbose[0] != '\0' && verbose[0] != '0';
        // Before any other llama.cpp call and before any thread of ours starts.
        llama_log_set(log_hook, nullptr);
        llama_backend_init();
    });
}

std::string last_llama_error() {
    std::string msg = t_last_error;
    while (!msg.empty() && (msg.back() == '\n' || msg.back() == ' ')) {
        msg.pop_back();
    }
    return msg;
}

void clear_last_llama_error() {
    t_last_error.clear();
    t_in_error = false;
}

}  // namespace fastpar
