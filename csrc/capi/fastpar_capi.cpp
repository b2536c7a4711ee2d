// The C ABI: conversion and validation only. Every exported body runs inside guard(),
// which turns any C++ exception into a status code and a per-thread message.
#include "fastpar.h"
#include "fastpar_fields.h"

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
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/loop/context.hpp"
#include "core/loop/requests.hpp"
#include "core/base/errors.hpp"
#include "core/model/model.hpp"
#include "capi_internal.hpp"

namespace fastpar_capi {

thread_local std::string t_last_error;

fastpar_status fail(fastpar_status status, const std::string & message) {
    t_last_error = message;
    return status;
}

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
        std::free(results[i].embedding);
        std::free(results[i].reasoning);
        for (int32_t j = 0; j < results[i].n_tool_calls; ++j) {
            const fastpar_tool_call & t = results[i].tool_calls[j];
            std::free(const_cast<char *>(t.id));
            std::free(const_cast<char *>(t.name));
            std::free(const_cast<char *>(t.arguments));
        }
        std::free(results[i].tool_calls);
    }
    std::free(results);
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

// The C type of each KIND of fastpar_fields.h: a field of fastpar.h whose type is not its
// kind's fails to compile here instead of converting wrongly.
#define FASTPAR_C_TYPE_INT32 int32_t
#define FASTPAR_C_TYPE_INT64 int64_t
#define FASTPAR_C_TYPE_FLOAT float
#define FASTPAR_C_TYPE_BOOL bool
#define FASTPAR_C_TYPE_STRING const char *
#define FASTPAR_C_TYPE_STRINGS const char * const *
#define FASTPAR_C_TYPE_BIASES const fastpar_logit_bias *
#define FASTPAR_C_TYPE_TOKENS const int32_t *
#define FASTPAR_CHECK_C_TYPE(Struct, name, kind, c, py, r)                                            \
    FASTPAR_WHEN(c, static_assert(std::is_same_v<decltype(Struct::name), FASTPAR_C_TYPE_##kind>, \
                                  #Struct "::" #name " is not of its kind " #kind);)
#define FASTPAR_CHECK_MODEL(...) FASTPAR_CHECK_C_TYPE(fastpar_model_params, __VA_ARGS__)
#define FASTPAR_CHECK_CONTEXT(...) FASTPAR_CHECK_C_TYPE(fastpar_context_params, __VA_ARGS__)
#define FASTPAR_CHECK_GENERATE(...) FASTPAR_CHECK_C_TYPE(fastpar_generate_params, __VA_ARGS__)
FASTPAR_MODEL_FIELDS(FASTPAR_CHECK_MODEL)
FASTPAR_CONTEXT_FIELDS(FASTPAR_CHECK_CONTEXT)
FASTPAR_GENERATE_FIELDS(FASTPAR_CHECK_GENERATE)

std::vector<std::string> to_core_strings(const char * name, const char * const * strings, int32_t n) {
    if (n < 0 || (n > 0 && strings == nullptr)) {
        throw std::invalid_argument(std::string(name) + " must point to n_" + name + " strings (n_" + name + " >= 0)");
    }
    std::vector<std::string> out;
    for (int32_t i = 0; i < n; ++i) {
        if (strings[i] == nullptr) {
            throw std::invalid_argument(std::string(name) + "[" + std::to_string(i) + "] is NULL");
        }
        out.emplace_back(strings[i]);
    }
    return out;
}

std::vector<std::pair<int32_t, float>> to_core_biases(const char * name, const fastpar_logit_bias * biases,
                                                      int32_t n) {
    if (n < 0 || (n > 0 && biases == nullptr)) {
        throw std::invalid_argument(std::string(name) + " must point to n_" + name + " entries (n_" + name + " >= 0)");
    }
    std::vector<std::pair<int32_t, float>> out;
    for (int32_t i = 0; i < n; ++i) {
        out.emplace_back(biases[i].token, biases[i].bias);
    }
    return out;
}

std::vector<int32_t> to_core_tokens(const char * name, const int32_t * tokens, int32_t n) {
    if (n < 0 || (n > 0 && tokens == nullptr)) {
        throw std::invalid_argument(std::string(name) + " must point to n_" + name + " token ids (n_" + name + " >= 0)");
    }
    return std::vector<int32_t>(tokens, tokens + n);
}

// One field between a C struct `c` and a C++ struct `core`, by kind: a NULL string is the
// core's "" (none), and a string list is its pointer and count.
#define FASTPAR_TO_CORE_INT32(name) core.name = c.name;
#define FASTPAR_TO_CORE_INT64(name) core.name = c.name;
#define FASTPAR_TO_CORE_FLOAT(name) core.name = c.name;
#define FASTPAR_TO_CORE_BOOL(name) core.name = c.name;
#define FASTPAR_TO_CORE_STRING(name) \
    if (c.name != nullptr) {         \
        core.name = c.name;          \
    }
#define FASTPAR_TO_CORE_STRINGS(name) core.name = to_core_strings(#name, c.name, c.n_##name);
#define FASTPAR_TO_CORE_BIASES(name) core.name = to_core_biases(#name, c.name, c.n_##name);
#define FASTPAR_TO_CORE_TOKENS(name) core.name = to_core_tokens(#name, c.name, c.n_##name);
#define FASTPAR_TO_CORE(name, kind, in_c, py, r) FASTPAR_WHEN(in_c, FASTPAR_TO_CORE_##kind(name))

// A string default other than none ("f16" for type_k) is a string that lives as long as
// the library; tests/test_fields.py compares every C default with the core's.
const char * c_default_string(const std::string & s) {
    if (s.empty()) {
        return nullptr;
    }
    static std::mutex mutex;
    static std::vector<std::unique_ptr<std::string>> kept;
    const std::lock_guard<std::mutex> lock(mutex);
    for (const auto & k : kept) {
        if (*k == s) {
            return k->c_str();
        }
    }
    kept.push_back(std::make_unique<std::string>(s));
    return kept.back()->c_str();
}

#define FASTPAR_TO_C_INT32(name) c.name = core.name;
#define FASTPAR_TO_C_INT64(name) c.name = core.name;
#define FASTPAR_TO_C_FLOAT(name) c.name = core.name;
#define FASTPAR_TO_C_BOOL(name) c.name = core.name;
#define FASTPAR_TO_C_STRING(name) c.name = c_default_string(core.name);
#define FASTPAR_TO_C_STRINGS(name) \
    c.name = nullptr;              \
    c.n_##name = 0;
#define FASTPAR_TO_C_BIASES(name) FASTPAR_TO_C_STRINGS(name)
#define FASTPAR_TO_C_TOKENS(name) FASTPAR_TO_C_STRINGS(name)
#define FASTPAR_TO_C(name, kind, in_c, py, r) FASTPAR_WHEN(in_c, FASTPAR_TO_C_##kind(name))

fastpar::ModelParams to_core(const fastpar_model_params & c) {
    fastpar::ModelParams core;
    FASTPAR_MODEL_FIELDS(FASTPAR_TO_CORE)
    return core;
}

fastpar::ContextParams to_core(const fastpar_context_params & c) {
    fastpar::ContextParams core;
    FASTPAR_CONTEXT_FIELDS(FASTPAR_TO_CORE)
    return core;
}

fastpar::GenerateParams to_core(const fastpar_generate_params & c) {
    fastpar::GenerateParams core;
    FASTPAR_GENERATE_FIELDS(FASTPAR_TO_CORE)
    return core;
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
        const std::string at = where + ".messages[" + std::to_string(j) + "]";
        if (m.n_tool_calls < 0 || (m.n_tool_calls > 0 && m.tool_calls == nullptr)) {
            throw std::invalid_argument(at + ".tool_calls must point to n_tool_calls calls (n_tool_calls >= 0)");
        }
        if (m.role == nullptr || (m.content == nullptr && m.n_tool_calls == 0)) {
            throw std::invalid_argument(at + " has a NULL role, or a NULL content and no tool calls");
        }
        fastpar::ChatMessage message{m.role, m.content != nullptr ? m.content : "", {}, {}};
        for (int32_t k = 0; k < m.n_tool_calls; ++k) {
            const fastpar_tool_call & t = m.tool_calls[k];
            if (t.name == nullptr || t.arguments == nullptr) {
                throw std::invalid_argument(at + ".tool_calls[" + std::to_string(k) + "] has a NULL name or arguments");
            }
            message.tool_calls.push_back(fastpar::ToolCall{t.id != nullptr ? t.id : "", t.name, t.arguments});
        }
        if (m.tool_call_id != nullptr) {
            message.tool_call_id = m.tool_call_id;
        }
        out.messages.push_back(std::move(message));
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
            if (!c.reasoning.empty()) {
                r.reasoning = dup_string(c.reasoning);
            }
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
            if (!c.embedding.empty()) {
                r.embedding = copy_array(c.embedding.data(), c.embedding.size());
                r.n_embedding = static_cast<int32_t>(c.embedding.size());
            }
            r.n_prompt_tokens = c.n_prompt_tokens;
            r.n_prompt_tokens_shared = c.n_prompt_tokens_shared;
            r.n_prompt_tokens_cached = c.n_prompt_tokens_cached;
            if (!c.tool_calls.empty()) {
                r.tool_calls = static_cast<fastpar_tool_call *>(std::calloc(c.tool_calls.size(), sizeof(fastpar_tool_call)));
                if (r.tool_calls == nullptr) {
                    throw std::bad_alloc();
                }
                for (const fastpar::ToolCall & t : c.tool_calls) {  // counted as filled, so a failure frees them
                    fastpar_tool_call & out_call = r.tool_calls[r.n_tool_calls++];
                    out_call.id = dup_string(t.id);
                    out_call.name = dup_string(t.name);
                    out_call.arguments = dup_string(t.arguments);
                }
            }
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

// n NUL-terminated raw-text prompts from the caller's array (`what` names it in messages:
// "prompts" or "texts"); throws InvalidArgument for a NULL array or entry, or n < 0.
std::vector<fastpar::Prompt> text_prompts(const char * const * texts, int32_t n, const std::string & what) {
    if (n < 0 || (n > 0 && texts == nullptr)) {
        throw fastpar::InvalidArgument(what + " must point to n_" + what + " strings (n_" + what + " >= 0)");
    }
    std::vector<fastpar::Prompt> in(static_cast<size_t>(n));
    for (int32_t i = 0; i < n; ++i) {
        if (texts[i] == nullptr) {
            throw fastpar::InvalidArgument(what + "[" + std::to_string(i) + "] is NULL");
        }
        in[static_cast<size_t>(i)].text = texts[i];
    }
    return in;
}

}  // namespace fastpar_capi

using namespace fastpar_capi;

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
        case FASTPAR_FINISH_TOOL_CALLS:
            return fastpar::finish_reason_name(static_cast<fastpar::FinishReason>(reason));
    }
    return "unknown";
}

// The C structs are filled field by field, by name (fastpar_fields.h): a field added to or
// moved in fastpar.h cannot silently take another's value.
fastpar_model_params fastpar_model_default_params(void) {
    const fastpar::ModelParams core;
    fastpar_model_params c{};
    FASTPAR_MODEL_FIELDS(FASTPAR_TO_C)
    return c;
}

fastpar_context_params fastpar_context_default_params(void) {
    const fastpar::ContextParams core;
    fastpar_context_params c{};
    FASTPAR_CONTEXT_FIELDS(FASTPAR_TO_C)
    return c;
}

fastpar_generate_params fastpar_generate_default_params(void) {
    const fastpar::GenerateParams core;
    fastpar_generate_params c{};
    FASTPAR_GENERATE_FIELDS(FASTPAR_TO_C)
    return c;
}

fastpar_status fastpar_model_load(const char * path, fastpar_model_params params, fastpar_model ** model_out) {
    return guard([&] {
        if (path == nullptr || model_out == nullptr) {
            return fail(FASTPAR_ERR_INVALID_ARGUMENT, "path and model_out must not be NULL");
        }
        auto handle = std::make_unique<fastpar_model>();
        handle->model = std::make_shared<fastpar::Model>(path, to_core(params));
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
        auto handle = std::make_unique<fastpar_context>();
        handle->ctx = std::make_unique<fastpar::Context>(model->model, to_core(params));
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
        const std::vector<fastpar::Prompt> in = text_prompts(prompts, n_prompts, "prompts");
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
        out.n_prompt_tokens_cached = s.n_prompt_tokens_cached;
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
