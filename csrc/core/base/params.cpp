#include "core/base/params.hpp"

#include <cmath>
#include <string>

#include "core/base/errors.hpp"
#include "core/base/text.hpp"

namespace fastpar {
namespace {

// llama.cpp's LLAMA_MAX_SEQ: the most sequences one context can hold.
constexpr int32_t kMaxParallel = 256;
// ggml's GGML_MAX_N_THREADS: its thread pool has room for no more.
constexpr int32_t kMaxThreads = 512;

[[noreturn]] void bad(const std::string & what) { throw InvalidArgument(what); }

void check_finite(const char * name, float v) {
    if (!std::isfinite(v)) {
        bad(std::string(name) + " must be a finite number, got " + std::to_string(v));
    }
}

void check_kv_cache_type(const char * name, const std::string & v) {
    std::string names;
    for (const char * t : kKvCacheTypes) {
        if (v == t) {
            return;
        }
        names += names.empty() ? std::string("\"") + t + "\"" : std::string(", \"") + t + "\"";
    }
    bad(std::string(name) + " must be one of " + names + ", got \"" + v + "\"");
}

}  // namespace

void validate(const ModelParams & p) {
    if (p.n_gpu_layers < -1) {
        bad("n_gpu_layers must be -1 (all), 0 or positive, got " + std::to_string(p.n_gpu_layers));
    }
}

void validate(const ContextParams & p) {
    if (p.n_parallel < 1 || p.n_parallel > kMaxParallel) {
        bad("n_parallel must be between 1 and " + std::to_string(kMaxParallel) + ", got " +
            std::to_string(p.n_parallel));
    }
    if (p.n_ctx_per_seq < 2) {
        bad("n_ctx_per_seq must be at least 2 (one prompt token and one generated), got " +
            std::to_string(p.n_ctx_per_seq));
    }
    if (static_cast<int64_t>(p.n_parallel) * p.n_ctx_per_seq > INT32_MAX) {
        bad("n_parallel x n_ctx_per_seq is too large for one context");
    }
    if (p.n_batch < 0 || (p.n_batch > 0 && p.n_batch < p.n_parallel)) {
        bad("n_batch (" + std::to_string(p.n_batch) + ") must be 0 (auto) or at least n_parallel (" +
            std::to_string(p.n_parallel) + "): every slot adds a token to each batch");
    }
    if (p.device_sampling < -1 || p.device_sampling > 1) {
        bad("device_sampling must be -1 (auto), 0 (host) or 1 (GPU), got " + std::to_string(p.device_sampling));
    }
    if (p.warmup < -1 || p.warmup > 1) {
        bad("warmup must be -1 (auto), 0 (off) or 1 (on), got " + std::to_string(p.warmup));
    }
    if (p.n_threads < 0 || p.n_threads > kMaxThreads) {
        bad("n_threads must be 0 (one per CPU this process may use) or 1 to " + std::to_string(kMaxThreads) + ", got " +
            std::to_string(p.n_threads));
    }
    check_kv_cache_type("type_k", p.type_k);
    check_kv_cache_type("type_v", p.type_v);
    if (p.prefix_cache_mib < -1 || p.prefix_cache_mib > kMaxPrefixCacheMib) {
        bad("prefix_cache_mib must be -1 (auto), 0 (off) or a budget in MiB up to " +
            std::to_string(kMaxPrefixCacheMib) + ", got " + std::to_string(p.prefix_cache_mib));
    }
    if (!p.prefix_cache_dir.empty() && p.prefix_cache_mib == 0) {
        bad("prefix_cache_dir needs the prefix cache on (prefix_cache_mib -1 or a budget in MiB), got 0 (off)");
    }
    if (!p.pooling.empty()) {
        bool known = false;
        std::string names;
        for (const char * name : kPoolings) {
            known = known || p.pooling == name;
            names += std::string(names.empty() ? "" : ", ") + "\"" + name + "\"";
        }
        if (!known) {
            bad("pooling must be one of " + names + " or empty (the model's own), got \"" + p.pooling + "\"");
        }
        if (!p.embeddings) {
            bad("pooling applies to an embeddings context: set embeddings too");
        }
    }
    if (p.embeddings && (p.prefix_cache_mib > 0 || !p.prefix_cache_dir.empty())) {
        bad("an embeddings context keeps no prefix cache (nothing is left after a text): leave prefix_cache_mib "
            "and prefix_cache_dir unset");
    }
}

void validate(const GenerateParams & p) {
    if (p.max_tokens < 0) {
        bad("max_tokens must be >= 0, got " + std::to_string(p.max_tokens));
    }
    check_finite("temperature", p.temperature);
    if (p.temperature < 0) {
        bad("temperature must be >= 0 (0 = greedy), got " + std::to_string(p.temperature));
    }
    if (p.top_k < 0) {
        bad("top_k must be >= 0 (0 = off), got " + std::to_string(p.top_k));
    }
    check_finite("top_p", p.top_p);
    if (p.top_p <= 0 || p.top_p > 1) {
        bad("top_p must be in (0, 1], got " + std::to_string(p.top_p));
    }
    check_finite("min_p", p.min_p);
    if (p.min_p < 0 || p.min_p > 1) {
        bad("min_p must be in [0, 1], got " + std::to_string(p.min_p));
    }
    check_finite("repeat_penalty", p.repeat_penalty);
    if (p.repeat_penalty <= 0) {
        bad("repeat_penalty must be > 0 (1 = off), got " + std::to_string(p.repeat_penalty));
    }
    check_finite("presence_penalty", p.presence_penalty);
    check_finite("frequency_penalty", p.frequency_penalty);
    if (p.repeat_last_n < 0) {
        bad("repeat_last_n must be >= 0, got " + std::to_string(p.repeat_last_n));
    }
    if (p.seed < -1 || p.seed > static_cast<int64_t>(UINT32_MAX)) {
        bad("seed must be -1 (random) or in [0, 2^32 - 1], got " + std::to_string(p.seed));
    }
    for (const auto & s : p.stop) {
        if (s.empty()) {
            bad("stop strings must not be empty");
        }
    }
    if (p.n < 1) {
        bad("n (samples per prompt) must be >= 1, got " + std::to_string(p.n));
    }
    if (p.prompt_logprobs_from < 1) {
        bad("prompt_logprobs_from must be >= 1 (the first prompt token has no log-probability), got " +
            std::to_string(p.prompt_logprobs_from));
    }
    if (p.top_logprobs < 0 || p.top_logprobs > kMaxTopLogprobs) {
        bad("top_logprobs must be in [0, " + std::to_string(kMaxTopLogprobs) + "], got " +
            std::to_string(p.top_logprobs));
    }
    if (static_cast<int>(!p.json_schema.empty()) + static_cast<int>(!p.grammar.empty()) +
            static_cast<int>(!p.choice.empty()) + static_cast<int>(!p.regex.empty()) > 1) {
        bad("json_schema, grammar, choice and regex are four ways to constrain the output: give one of them");
    }
    if (utf8_sanitize(p.regex) != p.regex) {
        bad("regex is not valid UTF-8");
    }
    for (const auto & [token, bias] : p.logit_bias) {
        if (token < 0) {
            bad("logit_bias names token " + std::to_string(token) + ": token ids are >= 0");
        }
        // -inf bans a token; +inf or NaN would leave no finite logit to sample from.
        if (std::isnan(bias) || bias == std::numeric_limits<float>::infinity()) {
            bad("logit_bias of token " + std::to_string(token) + " is " + std::to_string(bias) +
                ": a bias is a finite number, or -infinity to ban the token");
        }
    }
    if (!p.reasoning.empty() && p.reasoning != "split" && p.reasoning != "off") {
        bad("reasoning must be \"split\", \"off\" or none, got \"" + p.reasoning + "\"");
    }
    for (const int32_t token : p.allowed_token_ids) {
        if (token < 0) {
            bad("allowed_token_ids holds " + std::to_string(token) + ": token ids are >= 0");
        }
    }
    for (size_t i = 0; i < p.choice.size(); ++i) {
        if (p.choice[i].empty()) {
            bad("choice[" + std::to_string(i) + "] is empty: every choice must be a non-empty string");
        }
        if (utf8_sanitize(p.choice[i]) != p.choice[i]) {
            bad("choice[" + std::to_string(i) + "] is not valid UTF-8");
        }
    }
}

}  // namespace fastpar
