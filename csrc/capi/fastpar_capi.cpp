// The C ABI: conversion and validation only. Every exported body runs inside guard(),
// which turns any C++ exception into a status code and a per-thread message.
#include "fastpar.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>

#include "core/loop/context.hpp"
#include "core/loop/requests.hpp"
#include "core/base/errors.hpp"
#include "core/model/model.hpp"

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

namespace {

thread_local std::string t_last_error;

fastpar_status fail(fastpar_status status, const std::string & message) {
    t_last_error = message;
    return status;
}

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

Live & live() {
    static Live * l = new Live();  // never destroyed: frees may come from atexit handlers
    return *l;
}

fastpar_status not_live(const char * what) {
    return fail(FASTPAR_ERR_INVALID_ARGUMENT,
                std::string(what) + " is not a live handle of this library (freed already, or never made by it)");
}

void free_results(fastpar_completion * results, int32_t n_results) {
    for (int32_t i = 0; i < n_results; ++i) {
        std::free(results[i].text);
        std::free(results[i].token_ids);
        std::free(results[i].error);
        std::free(results[i].logprobs);
        std::free(results[i].top_logprob_ids);
        std::free(results[i].top_logprob_values);
    }
    std::free(results);
}

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

char * dup_string(const std::string & s) {
    char * out = static_cast<char *>(std::malloc(s.size() + 1));
    if (out == nullptr) {
        throw std::bad_alloc();
    }
    std::memcpy(out, s.data(), s.size());
    out[s.size()] = '\0';
    return out;
}

fastpar::GenerateParams to_core(const fastpar_generate_params & p) {
    fastpar::GenerateParams g;
    g.max_tokens = p.max_tokens;
    g.temperature = p.temperature;
    g.top_k = p.top_k;
    g.top_p = p.top_p;
    g.min_p = p.min_p;
    g.repeat_penalty = p.repeat_penalty;
    g.presence_penalty = p.presence_penalty;
    g.frequency_penalty = p.frequency_penalty;
    g.repeat_last_n = p.repeat_last_n;
    g.seed = p.seed;
    g.ignore_eos = p.ignore_eos;
    g.logprobs = p.logprobs;
    g.n = p.n;
    g.top_logprobs = p.top_logprobs;
    if (p.json_schema != nullptr) {
        g.json_schema = p.json_schema;
    }
    if (p.grammar != nullptr) {
        g.grammar = p.grammar;
    }
    if (p.json_schema != nullptr && p.grammar != nullptr) {
        throw std::invalid_argument("json_schema and grammar were both given; a prompt takes one constraint");
    }
    if (p.n_stop < 0 || (p.n_stop > 0 && p.stop == nullptr)) {
        throw std::invalid_argument("stop must point to n_stop strings (n_stop >= 0)");
    }
    for (int32_t i = 0; i < p.n_stop; ++i) {
        if (p.stop[i] == nullptr) {
            throw std::invalid_argument("stop[" + std::to_string(i) + "] is NULL");
        }
        g.stop.emplace_back(p.stop[i]);
    }
    return g;
}

fastpar::Prompt to_core(const fastpar_prompt & p, int32_t i) {
    fastpar::Prompt out;
    const std::string where = "prompts[" + std::to_string(i) + "]";
    if (p.text != nullptr) {
        if (p.n_messages != 0 || p.messages != nullptr) {
            throw std::invalid_argument(where + " has both text and messages; give one");
        }
        out.text = p.text;
        return out;
    }
    if (p.n_messages <= 0 || p.messages == nullptr) {
        throw std::invalid_argument(where + " has neither text nor messages (n_messages >= 1)");
    }
    out.is_chat = true;
    for (int32_t j = 0; j < p.n_messages; ++j) {
        const fastpar_message & m = p.messages[j];
        if (m.role == nullptr || m.content == nullptr) {
            throw std::invalid_argument(where + ".messages[" + std::to_string(j) + "] has a NULL role or content");
        }
        out.messages.push_back(fastpar::ChatMessage{m.role, m.content});
    }
    return out;
}

template <typename T>
T * copy_array(const T * data, size_t n) {
    auto * out = static_cast<T *>(std::malloc(sizeof(T) * (n + 1)));
    if (out == nullptr) {
        throw std::bad_alloc();
    }
    std::copy(data, data + n, out);
    return out;
}

// The C results of a call: allocated all first, so a failure leaves nothing behind.
fastpar_completion * to_c(const std::vector<fastpar::Completion> & out) {
    auto * results = static_cast<fastpar_completion *>(std::calloc(out.size(), sizeof(fastpar_completion)));
    if (results == nullptr) {
        throw std::bad_alloc();
    }
    try {
        for (size_t i = 0; i < out.size(); ++i) {
            const fastpar::Completion & c = out[i];
            fastpar_completion & r = results[i];
            r.text = dup_string(c.text);
            r.text_len = c.text.size();
            r.n_gen_tokens = static_cast<int32_t>(c.token_ids.size());
            r.token_ids = copy_array(c.token_ids.data(), c.token_ids.size());
            if (!c.logprobs.empty()) {
                r.logprobs = copy_array(c.logprobs.data(), c.logprobs.size());
            }
            if (!c.top_logprobs.empty() && !c.top_logprobs.front().empty()) {
                const size_t k = c.top_logprobs.front().size();
                std::vector<int32_t> ids;
                std::vector<float> values;
                for (const auto & position : c.top_logprobs) {
                    for (size_t j = 0; j < k; ++j) {
                        ids.push_back(j < position.size() ? position[j].token : -1);
                        values.push_back(j < position.size() ? position[j].logprob : -INFINITY);
                    }
                }
                r.n_top_logprobs = static_cast<int32_t>(k);
                r.top_logprob_ids = copy_array(ids.data(), ids.size());
                r.top_logprob_values = copy_array(values.data(), values.size());
            }
            r.n_prompt_tokens = c.n_prompt_tokens;
            r.n_prompt_tokens_shared = c.n_prompt_tokens_shared;
            r.finish_reason = static_cast<fastpar_finish_reason>(c.finish_reason);
            r.error = c.finish_reason == fastpar::FinishReason::Error ? dup_string(c.error) : nullptr;
        }
        live().add(results, Kind::Results, static_cast<int32_t>(out.size()));
    } catch (...) {
        free_results(results, static_cast<int32_t>(out.size()));
        throw;
    }
    return results;
}

}  // namespace

extern "C" {

const char * fastpar_version(void) { return fastpar::version(); }
const char * fastpar_backend(void) { return fastpar::backend_name(); }
const char * fastpar_last_error(void) { return t_last_error.c_str(); }

const char * fastpar_finish_reason_name(fastpar_finish_reason reason) {
    switch (reason) {
        case FASTPAR_FINISH_STOP:
        case FASTPAR_FINISH_LENGTH:
        case FASTPAR_FINISH_ERROR:
        case FASTPAR_FINISH_CANCELLED:
            return fastpar::finish_reason_name(static_cast<fastpar::FinishReason>(reason));
    }
    return "unknown";
}

// The C structs are filled field by field, by name: a field added to or moved in
// fastpar.h cannot silently take another's value.
fastpar_model_params fastpar_model_default_params(void) {
    const fastpar::ModelParams d;
    fastpar_model_params p{};
    p.n_gpu_layers = d.n_gpu_layers;
    p.use_mmap = d.use_mmap;
    return p;
}

fastpar_context_params fastpar_context_default_params(void) {
    const fastpar::ContextParams d;
    fastpar_context_params p{};
    p.n_parallel = d.n_parallel;
    p.n_ctx_per_seq = d.n_ctx_per_seq;
    p.n_batch = d.n_batch;
    p.n_threads = d.n_threads;
    p.kv_unified = d.kv_unified;
    p.device_sampling = d.device_sampling;
    p.share_prefixes = d.share_prefixes;
    p.warmup = d.warmup;
    return p;
}

fastpar_generate_params fastpar_generate_default_params(void) {
    const fastpar::GenerateParams d;
    fastpar_generate_params p{};
    p.max_tokens = d.max_tokens;
    p.temperature = d.temperature;
    p.top_k = d.top_k;
    p.top_p = d.top_p;
    p.min_p = d.min_p;
    p.repeat_penalty = d.repeat_penalty;
    p.presence_penalty = d.presence_penalty;
    p.frequency_penalty = d.frequency_penalty;
    p.repeat_last_n = d.repeat_last_n;
    p.seed = d.seed;
    p.stop = nullptr;
    p.n_stop = 0;
    p.ignore_eos = d.ignore_eos;
    p.logprobs = d.logprobs;
    p.n = d.n;
    p.top_logprobs = d.top_logprobs;
    p.json_schema = nullptr;
    p.grammar = nullptr;
    return p;
}

fastpar_status fastpar_model_load(const char * path, fastpar_model_params params, fastpar_model ** model_out) {
    return guard([&] {
        if (path == nullptr || model_out == nullptr) {
            return fail(FASTPAR_ERR_INVALID_ARGUMENT, "path and model_out must not be NULL");
        }
        fastpar::ModelParams mp;
        mp.n_gpu_layers = params.n_gpu_layers;
        mp.use_mmap = params.use_mmap;
        auto handle = std::make_unique<fastpar_model>();
        handle->model = std::make_shared<fastpar::Model>(path, mp);
        live().add(handle.get(), Kind::Model);
        *model_out = handle.release();
        return FASTPAR_OK;
    });
}

void fastpar_model_free(fastpar_model * model) {
    t_last_error.clear();
    if (model != nullptr && !live().remove(model, Kind::Model)) {
        not_live("fastpar_model_free: model");
        return;
    }
    delete model;
}

fastpar_status fastpar_context_new(fastpar_model * model, fastpar_context_params params,
                                   fastpar_context ** ctx_out) {
    return guard([&] {
        if (model == nullptr || ctx_out == nullptr) {
            return fail(FASTPAR_ERR_INVALID_ARGUMENT, "model and ctx_out must not be NULL");
        }
        if (!live().has(model, Kind::Model)) {
            return not_live("model");
        }
        fastpar::ContextParams cp;
        cp.n_parallel = params.n_parallel;
        cp.n_ctx_per_seq = params.n_ctx_per_seq;
        cp.n_batch = params.n_batch;
        cp.n_threads = params.n_threads;
        cp.kv_unified = params.kv_unified;
        cp.device_sampling = params.device_sampling;
        cp.share_prefixes = params.share_prefixes;
        cp.warmup = params.warmup;
        auto handle = std::make_unique<fastpar_context>();
        handle->ctx = std::make_unique<fastpar::Context>(model->model, cp);
        live().add(handle.get(), Kind::Context);
        *ctx_out = handle.release();
        return FASTPAR_OK;
    });
}

void fastpar_context_free(fastpar_context * ctx) {
    t_last_error.clear();
    if (ctx != nullptr && !live().remove(ctx, Kind::Context)) {
        not_live("fastpar_context_free: ctx");
        return;
    }
    delete ctx;
}

fastpar_status fastpar_context_set_interrupt(fastpar_context * ctx, fastpar_interrupt_fn fn, void * user_data) {
    return guard([&] {
        if (ctx == nullptr) {
            return fail(FASTPAR_ERR_INVALID_ARGUMENT, "ctx must not be NULL");
        }
        if (!live().has(ctx, Kind::Context)) {
            return not_live("ctx");
        }
        ctx->interrupt = fn;
        ctx->interrupt_data = fn != nullptr ? user_data : nullptr;
        return FASTPAR_OK;
    });
}

fastpar_status fastpar_generate_parallel(fastpar_context * ctx, const char * const * prompts, int32_t n_prompts,
                                         fastpar_generate_params params, fastpar_completion ** results_out) {
    return guard([&] {
        if (ctx == nullptr || results_out == nullptr) {
            return fail(FASTPAR_ERR_INVALID_ARGUMENT, "ctx and results_out must not be NULL");
        }
        if (!live().has(ctx, Kind::Context)) {
            return not_live("ctx");
        }
        if (n_prompts < 0 || (n_prompts > 0 && prompts == nullptr)) {
            return fail(FASTPAR_ERR_INVALID_ARGUMENT, "prompts must point to n_prompts strings (n_prompts >= 0)");
        }
        std::vector<fastpar::Prompt> in(static_cast<size_t>(n_prompts));
        for (int32_t i = 0; i < n_prompts; ++i) {
            if (prompts[i] == nullptr) {
                return fail(FASTPAR_ERR_INVALID_ARGUMENT, "prompts[" + std::to_string(i) + "] is NULL");
            }
            in[static_cast<size_t>(i)].text = prompts[i];
        }
        const fastpar::GenerateParams gp = to_core(params);
        if (gp.n != 1) {
            return fail(FASTPAR_ERR_INVALID_ARGUMENT, "n=" + std::to_string(gp.n) +
                                                          ": fastpar_generate_parallel returns one completion a "
                                                          "prompt; use fastpar_generate for samples");
        }
        if (n_prompts == 0) {
            fastpar::check_params(gp);
            *results_out = nullptr;
            return FASTPAR_OK;
        }
        const std::vector<fastpar::Completion> out = ctx->ctx->generate(in, gp, ctx->interrupt_check());
        *results_out = to_c(out);
        return FASTPAR_OK;
    });
}

fastpar_status fastpar_generate(fastpar_context * ctx, const fastpar_prompt * prompts, int32_t n_prompts,
                                const fastpar_generate_params * params, int32_t n_params,
                                fastpar_completion ** results_out, int32_t * n_results_out) {
    return guard([&] {
        if (ctx == nullptr || results_out == nullptr || n_results_out == nullptr) {
            return fail(FASTPAR_ERR_INVALID_ARGUMENT, "ctx, results_out and n_results_out must not be NULL");
        }
        if (!live().has(ctx, Kind::Context)) {
            return not_live("ctx");
        }
        if (n_prompts < 0 || (n_prompts > 0 && prompts == nullptr)) {
            return fail(FASTPAR_ERR_INVALID_ARGUMENT, "prompts must point to n_prompts prompts (n_prompts >= 0)");
        }
        std::vector<fastpar::GenerateParams> gp;
        if (params == nullptr) {
            gp.emplace_back();
        } else {
            if (n_params != 1 && n_params != n_prompts) {
                return fail(FASTPAR_ERR_INVALID_ARGUMENT,
                            "n_params must be 1 (for every prompt) or n_prompts (" + std::to_string(n_prompts) +
                                "), got " + std::to_string(n_params));
            }
            for (int32_t i = 0; i < n_params; ++i) {
                gp.push_back(to_core(params[i]));
            }
        }
        std::vector<fastpar::Prompt> in;
        in.reserve(static_cast<size_t>(n_prompts));
        for (int32_t i = 0; i < n_prompts; ++i) {
            in.push_back(to_core(prompts[i], i));
        }
        if (n_prompts == 0) {
            for (const auto & p : gp) {
                fastpar::check_params(p);
            }
            *results_out = nullptr;
            *n_results_out = 0;
            return FASTPAR_OK;
        }
        const std::vector<fastpar::Completion> out = ctx->ctx->generate(in, gp, ctx->interrupt_check());
        if (out.size() > static_cast<size_t>(INT32_MAX)) {
            return fail(FASTPAR_ERR_INVALID_ARGUMENT, "more than 2^31 - 1 completions");
        }
        *results_out = to_c(out);
        *n_results_out = static_cast<int32_t>(out.size());
        return FASTPAR_OK;
    });
}

void fastpar_results_free(fastpar_completion * results, int32_t n_results) {
    t_last_error.clear();
    int32_t n = 0;
    if (results == nullptr) {
        return;
    }
    if (!live().remove(results, Kind::Results, &n)) {
        not_live("fastpar_results_free: results");
        return;
    }
    if (n_results != n) {  // the array's own length: a wrong count must not read past it
        fail(FASTPAR_ERR_INVALID_ARGUMENT, "fastpar_results_free: n_results is " + std::to_string(n_results) +
                                               ", the results hold " + std::to_string(n) + "; freed all " +
                                               std::to_string(n));
    }
    free_results(results, n);
}

fastpar_status fastpar_context_last_stats(const fastpar_context * ctx, fastpar_stats * stats_out) {
    return guard([&] {
        if (ctx == nullptr || stats_out == nullptr) {
            return fail(FASTPAR_ERR_INVALID_ARGUMENT, "ctx and stats_out must not be NULL");
        }
        if (!live().has(ctx, Kind::Context)) {
            return not_live("ctx");
        }
        const fastpar::Stats s = ctx->ctx->last_stats();
        fastpar_stats out{};
        out.n_prompts = s.n_prompts;
        out.n_failed = s.n_failed;
        out.n_prompt_tokens = s.n_prompt_tokens;
        out.n_prompt_tokens_shared = s.n_prompt_tokens_shared;
        out.n_gen_tokens = s.n_gen_tokens;
        out.t_prompt_ms = s.t_prompt_ms;
        out.t_gen_ms = s.t_gen_ms;
        out.t_wall_ms = s.t_wall_ms;
        out.prompt_tokens_per_s = s.prompt_tokens_per_s();
        out.gen_tokens_per_s = s.gen_tokens_per_s();
        out.total_tokens_per_s = s.total_tokens_per_s();
        out.n_decode_calls = s.n_decode_calls;
        out.n_kv_full_retries = s.n_kv_full_retries;
        out.n_device_sampled = s.n_device_sampled;
        out.t_sample_ms = s.t_sample_ms;
        out.n_padding_tokens = s.n_padding_tokens;
        *stats_out = out;
        return FASTPAR_OK;
    });
}

}  // extern "C"
