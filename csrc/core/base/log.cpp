#include "core/base/log.hpp"

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

#ifdef GGML_BACKEND_DL
#include <dlfcn.h>

#include "core/base/errors.hpp"
#endif

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
        // Every error since the last clear, the first one (usually the cause) first: a
        // failed load ends with a generic "failed to load model" after the reason.
        if (t_last_error.size() > 4096) {
            t_last_error.clear();
        }
        while (!t_last_error.empty() && (t_last_error.back() == '\n' || t_last_error.back() == ' ')) {
            t_last_error.pop_back();
        }
        t_last_error += t_last_error.empty() ? "" : "; ";
        t_last_error += text;
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

#ifdef GGML_BACKEND_DL
// The folder libfastpar was loaded from: the portable build ships ggml's backends there.
std::string library_dir() {
    Dl_info info{};
    if (dladdr(reinterpret_cast<void *>(&backend_init), &info) == 0 || info.dli_fname == nullptr) {
        return std::string();
    }
    std::string path = info.dli_fname;
    const size_t slash = path.find_last_of('/');
    return slash == std::string::npos ? std::string(".") : path.substr(0, slash);
}
#endif

}  // namespace

void backend_init() {
    static std::once_flag once;
    std::call_once(once, [] {
        const char * verbose = std::getenv("FASTPAR_VERBOSE");
        g_verbose = verbose != nullptr && verbose[0] != '\0' && verbose[0] != '0';
        // Before any other llama.cpp call and before any thread of ours starts.
        llama_log_set(log_hook, nullptr);
#ifdef GGML_BACKEND_DL
        // Portable build (FASTPAR_PORTABLE): the CPU backend is one shared library per x86-64
        // level next to libfastpar, and ggml loads the best one this CPU can run.
        const std::string dir = library_dir();
        ggml_backend_load_all_from_path(dir.empty() ? nullptr : dir.c_str());
        if (ggml_backend_dev_count() == 0) {
            throw Error("no ggml backend could be loaded from '" + dir +
                        "' (the libggml-cpu-*.so files of a portable build belong next to libfastpar)");
        }
#endif
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
