// What the C ABI's source files share (fastpar_capi.cpp, capi_embed.cpp): the handles'
// structs, the registry of live handles, guard() and the conversions of results. Nothing
// here is exported: libfastpar.map exports fastpar_* and fastpar:: alone.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/base/errors.hpp"
#include "core/base/results.hpp"
#include "core/loop/context.hpp"
#include "core/loop/requests.hpp"
#include "core/model/model.hpp"
#include "fastpar.h"

struct fastpar_model {
    std::shared_ptr<fastpar::Model> model;
};

struct fastpar_context {
    std::unique_ptr<fastpar::Context> ctx;
    fastpar_interrupt_fn interrupt = nullptr;  // fastpar_context_set_interrupt
    void * interrupt_data = nullptr;

    // The check passed to Context::generate: empty when none is set.
    std::function<bool()> interrupt_check() const {
        if (interrupt == nullptr) {
            return {};
        }
        return [fn = interrupt, data = interrupt_data] { return fn(data); };
    }
};

namespace fastpar_capi {

extern thread_local std::string t_last_error;

// Sets this thread's message (fastpar_last_error) and returns `status`.
fastpar_status fail(fastpar_status status, const std::string & message);

// The handles this library made and has not freed, each with its kind (for a results
// array, also its length). Every call checks its handle here first, so a freed, foreign or
// garbage pointer is an error status, and a second free does nothing, instead of a use
// after free. The kind matters: the allocator may give a freed model's address to a new
// context or results array, and that must not pass for a model. (A freed handle whose
// address a new handle of the same kind took is that new handle; and freeing a handle while
// another thread is inside a call with it remains the caller's error.)
enum class Kind : uint8_t { Model, Context, Results };

class Live {
public:
    void add(const void * p, Kind kind, int32_t n = 0) {
        std::lock_guard<std::mutex> lock(mu_);
        live_[p] = Handle{kind, n};
    }
    bool has(const void * p, Kind kind) const {
        std::lock_guard<std::mutex> lock(mu_);
        const auto it = live_.find(p);
        return it != live_.end() && it->second.kind == kind;
    }
    // Removes `p` if it is a live handle of that kind; false otherwise. `n` receives a
    // results array's length.
    bool remove(const void * p, Kind kind, int32_t * n = nullptr) {
        std::lock_guard<std::mutex> lock(mu_);
        const auto it = live_.find(p);
        if (it == live_.end() || it->second.kind != kind) {
            return false;
        }
        if (n != nullptr) {
            *n = it->second.n;
        }
        live_.erase(it);
        return true;
    }

private:
    struct Handle {
        Kind kind;
        int32_t n;
    };
    mutable std::mutex mu_;
    std::unordered_map<const void *, Handle> live_;
};

Live & live();

// The status for a handle `what` that live() does not hold.
fastpar_status not_live(const char * what);

template <typename F>
fastpar_status guard(F && body) {
    try {
        t_last_error.clear();
        return body();
    } catch (const fastpar::FileNotFound & e) {
        return fail(FASTPAR_ERR_NOT_FOUND, e.what());
    } catch (const fastpar::ModelLoadError & e) {
        return fail(FASTPAR_ERR_MODEL_LOAD, e.what());
    } catch (const fastpar::Interrupted & e) {
        return fail(FASTPAR_ERR_INTERRUPTED, e.what());
    } catch (const std::invalid_argument & e) {
        return fail(FASTPAR_ERR_INVALID_ARGUMENT, e.what());
    } catch (const std::bad_alloc &) {
        return fail(FASTPAR_ERR_OUT_OF_MEMORY, "out of memory");
    } catch (const std::exception & e) {
        return fail(FASTPAR_ERR_RUNTIME, e.what());
    } catch (...) {
        return fail(FASTPAR_ERR_RUNTIME, "unknown error");
    }
}

// The C results of a call (freed by fastpar_results_free).
fastpar_completion * to_c(const std::vector<fastpar::Completion> & out);

// n NUL-terminated raw-text prompts from the caller's array (`what` names it in messages:
// "prompts" or "texts"); throws InvalidArgument for a NULL array or entry, or n < 0.
std::vector<fastpar::Prompt> text_prompts(const char * const * texts, int32_t n, const std::string & what);

}  // namespace fastpar_capi
