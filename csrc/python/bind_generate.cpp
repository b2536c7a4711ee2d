#include <algorithm>
#include <chrono>
#include <limits>
#include <cmath>
#include <optional>
#include <string>
#include <tuple>
#include <variant>
#include <vector>

#include <pybind11/numpy.h>
#include <pybind11/stl.h>
#include <pybind11/typing.h>

#include "core/loop/context.hpp"
#include "core/loop/requests.hpp"
#include "core/base/errors.hpp"
#include "python/module.hpp"
#include "python/records.hpp"

namespace py = pybind11;

namespace fastpar::python {
namespace {

// How often generation looks for a pending Ctrl-C; taking the GIL each step would make
// the loop wait on other Python threads.
constexpr auto kSignalPollInterval = std::chrono::milliseconds(50);

// on_completion(index, completion); its type names its arguments in the signature.
using OnCompletion = py::typing::Callable<void(int64_t, const Completion &)>;

std::vector<Prompt> to_prompts(const std::vector<PromptIn> & prompts_in) {
    std::vector<Prompt> prompts;
    prompts.reserve(prompts_in.size());
    for (const auto & in : prompts_in) {
        prompts.push_back(to_prompt(in));
    }
    return prompts;
}

// Runs `call(interrupt, callback)` (a Context call) without the GIL. The call ends with the
// first Python error: a Ctrl-C (or another signal handler's exception) seen between steps,
// or an exception from the callback. That error is fetched at once and re-raised when the
// call returns; from then on the callback is not called again: the prompts the call
// cancels on its way out are not results, and calling Python while an error is pending
// would lose it.
template <typename Call>
std::vector<Completion> run_call(const std::optional<OnCompletion> & on_completion, Call && call) {
    std::optional<py::error_already_set> error;
    std::function<void(size_t, const Completion &)> callback;
    if (on_completion) {
        callback = [&on_completion, &error](size_t i, const Completion & c) {
            if (error) {
                return;
            }
            py::gil_scoped_acquire gil;
            try {
                (*on_completion)(i, c);
            } catch (py::error_already_set & e) {
                error.emplace(std::move(e));
                throw Interrupted();
            }
        };
    }
    auto next_poll = std::chrono::steady_clock::now() + kSignalPollInterval;
    std::function<bool()> interrupt = [&]() {
        const auto now = std::chrono::steady_clock::now();
        if (now < next_poll) {
            return false;
        }
        next_poll = now + kSignalPollInterval;
        py::gil_scoped_acquire gil;
        if (PyErr_CheckSignals() != 0) {
            error.emplace();  // fetches the KeyboardInterrupt (or other) the handler raised
        }
        return error.has_value();
    };
    try {
        py::gil_scoped_release nogil;
        return call(interrupt, callback);
    } catch (const Interrupted &) {
        if (error) {
            throw *error;
        }
        throw;
    }
}

std::vector<Completion> generate(Context & ctx, const std::vector<PromptIn> & prompts_in,
                                 const std::vector<GenerateParams> & params,
                                 const std::optional<OnCompletion> & on_completion) {
    const std::vector<Prompt> prompts = to_prompts(prompts_in);
    return run_call(on_completion, [&](const auto & interrupt, const auto & callback) {
        return ctx.generate(prompts, params, interrupt, callback);
    });
}

// Every text's vector as one float32 array of rows (NaN rows where a text failed), and
// each row's error (None where it did not): building the array here saves a Python list
// per row.
std::tuple<py::array_t<float>, std::vector<std::optional<std::string>>> embed(
    Context & ctx, const std::vector<PromptIn> & prompts_in, bool normalize,
    const std::optional<OnCompletion> & on_completion) {
    const std::vector<Prompt> prompts = to_prompts(prompts_in);
    EmbedParams params;
    params.normalize = normalize;
    const std::vector<Completion> results = run_call(on_completion, [&](const auto & interrupt, const auto & callback) {
        return ctx.embed(prompts, params, interrupt, callback);
    });
    const auto n_embd = static_cast<size_t>(ctx.embedding_size());
    py::array_t<float> rows({results.size(), n_embd});
    std::vector<std::optional<std::string>> errors(results.size());
    float * out = rows.mutable_data();
    for (size_t i = 0; i < results.size(); ++i) {
        const Completion & c = results[i];
        float * row = out + i * n_embd;
        if (c.finish_reason == FinishReason::Error || c.embedding.size() != n_embd) {
            std::fill(row, row + n_embd, std::numeric_limits<float>::quiet_NaN());
            errors[i] = c.error.empty() ? std::string("no vector was made for this text") : c.error;
        } else {
            std::copy(c.embedding.begin(), c.embedding.end(), row);
        }
    }
    return {std::move(rows), std::move(errors)};
}

// Per position, the k most likely tokens as (token_id, text, logprob) tuples. Returned as
// C++ types so that the signature, and the generated stub, name them.
using TopEntries = std::vector<std::vector<std::tuple<int32_t, std::string, float>>>;

TopEntries top_list(const std::vector<std::vector<TopLogprob>> & positions) {
    TopEntries out;
    out.reserve(positions.size());
    for (const auto & position : positions) {
        auto & entries = out.emplace_back();
        entries.reserve(position.size());
        for (const auto & e : position) {
            entries.emplace_back(e.token, e.text, e.logprob);
        }
    }
    return out;
}

}  // namespace

Prompt to_prompt(const PromptIn & in) {
    Prompt p;
    if (const auto * text = std::get_if<std::string>(&in)) {
        p.text = *text;
    } else if (const auto * tokens = std::get_if<std::vector<int32_t>>(&in)) {
        p.tokens = *tokens;
        p.is_tokens = true;
    } else {
        p.messages = std::get<std::vector<ChatMessage>>(in);
        p.is_chat = true;
    }
    return p;
}

void register_generate(py::module_ & m) {
    {
        py::class_<ContextParams> options(m, "ContextParams", "Options of a context; defaults are fastpar's.");
        options.def(py::init<>());
        FASTPAR_CONTEXT_FIELDS(FASTPAR_PY_OPTION)
        // The ranges, without a model: a command line checks its options before it starts.
        options.def("validate", [](const ContextParams & p) { validate(p); },
                    "Raises ValueError naming the first option out of range.");
    }
    {
        py::class_<GenerateParams> options(m, "GenerateParams", "Options of a generate call; defaults are fastpar's.");
        options.def(py::init<>());
        FASTPAR_GENERATE_FIELDS(FASTPAR_PY_OPTION)
        options.def("validate", [](const GenerateParams & p) { check_params(p); },
                    "Raises ValueError naming the first option out of range.");
    }
    m.attr("MAX_TOP_LOGPROBS") = kMaxTopLogprobs;
    m.def("render_tools",
          [](const Model & model, const std::string & messages, const GenerateParams & params) {
              py::gil_scoped_release release;
              std::string prompt;
              GenerateParams out = render_tools(model, messages, params, prompt);
              return std::make_tuple(std::move(prompt), std::move(out));
          },
          py::arg("model"), py::arg("messages"), py::arg("params"),
          "OpenAI messages (JSON text) rendered with params' tools by the model's template: the prompt "
          "text, and the params to generate it with (the calls' grammar, parser and stops; tools cleared).");

    auto completion = py::class_<Completion>(m, "Completion", "The answer to one prompt.")
        .def_readonly("text", &Completion::text)
        .def_readonly("reasoning", &Completion::reasoning)
        .def_readonly("token_ids", &Completion::token_ids)
        .def_readonly("logprobs", &Completion::logprobs)
        .def_property_readonly("top_logprobs",
                               [](const Completion & c) { return top_list(c.top_logprobs); })
        .def_readonly("prompt_token_ids", &Completion::prompt_token_ids)
        .def_property_readonly("prompt_logprobs",
                               [](const Completion & c) {
                                   // None where a token has no log-probability (the first).
                                   std::vector<std::optional<double>> out;
                                   out.reserve(c.prompt_logprobs.size());
                                   for (float v : c.prompt_logprobs) {
                                       out.push_back(std::isnan(v) ? std::nullopt : std::optional<double>(v));
                                   }
                                   return out;
                               })
        .def_property_readonly("prompt_greedy",
                               [](const Completion & c) {
                                   return std::vector<bool>(c.prompt_greedy.begin(), c.prompt_greedy.end());
                               })
        .def_property_readonly("prompt_top_logprobs",
                               [](const Completion & c) { return top_list(c.prompt_top_logprobs); })
        .def_property_readonly("finish_reason", [](const Completion & c) { return finish_reason_name(c.finish_reason); })
        .def_property_readonly("error", [](const Completion & c) -> std::optional<std::string> {
            return c.finish_reason == FinishReason::Error ? std::optional<std::string>(c.error) : std::nullopt;
        })
        .def_readonly("n_prompt_tokens", &Completion::n_prompt_tokens)
        .def_readonly("n_prompt_tokens_shared", &Completion::n_prompt_tokens_shared)
        .def_readonly("n_prompt_tokens_cached", &Completion::n_prompt_tokens_cached)
        .def_readonly("n_gen_tokens", &Completion::n_gen_tokens)
        .def_readonly("t_queued_ms", &Completion::t_queued_ms)
        .def_readonly("t_first_token_ms", &Completion::t_first_token_ms)
        .def_readonly("t_total_ms", &Completion::t_total_ms)
        .def_readonly("embedding", &Completion::embedding)
        .def_readonly("tool_calls", &Completion::tool_calls);
    def_record(completion, "Completion",
               {"finish_reason", "error", "n_prompt_tokens", "n_prompt_tokens_shared", "n_gen_tokens", "t_total_ms",
                "text"},
               {"text", "reasoning", "token_ids", "logprobs", "top_logprobs", "prompt_token_ids", "prompt_logprobs", "prompt_greedy", "prompt_top_logprobs", "finish_reason", "error", "n_prompt_tokens", "n_prompt_tokens_shared",
                "n_prompt_tokens_cached", "n_gen_tokens", "t_queued_ms", "t_first_token_ms", "t_total_ms", "embedding", "tool_calls"});

    auto stats = py::class_<Stats>(m, "Stats", "Statistics of one generate call.")
        .def_readonly("n_prompts", &Stats::n_prompts)
        .def_readonly("n_failed", &Stats::n_failed)
        .def_readonly("n_prompt_tokens", &Stats::n_prompt_tokens)
        .def_readonly("n_prompt_tokens_shared", &Stats::n_prompt_tokens_shared)
        .def_readonly("n_prompt_tokens_cached", &Stats::n_prompt_tokens_cached)
        .def_readonly("n_gen_tokens", &Stats::n_gen_tokens)
        .def_readonly("t_prompt_ms", &Stats::t_prompt_ms)
        .def_readonly("t_gen_ms", &Stats::t_gen_ms)
        .def_readonly("t_wall_ms", &Stats::t_wall_ms)
        .def_readonly("n_decode_calls", &Stats::n_decode_calls)
        .def_readonly("n_kv_full_retries", &Stats::n_kv_full_retries)
        .def_readonly("n_device_sampled", &Stats::n_device_sampled)
        .def_readonly("t_sample_ms", &Stats::t_sample_ms)
        .def_readonly("n_padding_tokens", &Stats::n_padding_tokens)
        .def_readonly("n_preempted", &Stats::n_preempted)
        .def_readonly("n_grammar_kept", &Stats::n_grammar_kept)
        .def_readonly("n_grammar_top", &Stats::n_grammar_top)
        .def_readonly("n_grammar_wider", &Stats::n_grammar_wider)
        .def_readonly("n_grammar_whole", &Stats::n_grammar_whole)
        .def_readonly("n_grammar_cached", &Stats::n_grammar_cached)
        .def_readonly("n_threads_low", &Stats::n_threads_low)
        .def_property_readonly("backend", [](const Stats &) { return std::string(backend_name()); })
        .def_property_readonly("prompt_tokens_per_s", &Stats::prompt_tokens_per_s)
        .def_property_readonly("gen_tokens_per_s", &Stats::gen_tokens_per_s)
        .def_property_readonly("total_tokens_per_s", &Stats::total_tokens_per_s);
    const std::vector<const char *> stats_fields = {
        "n_prompts", "n_failed", "n_prompt_tokens", "n_prompt_tokens_shared", "n_prompt_tokens_cached",
        "n_gen_tokens", "t_prompt_ms",
        "t_gen_ms", "t_wall_ms", "n_decode_calls", "n_kv_full_retries", "n_device_sampled", "t_sample_ms",
        "n_padding_tokens", "n_preempted", "n_grammar_kept", "n_grammar_top", "n_grammar_wider", "n_grammar_whole",
        "n_grammar_cached", "n_threads_low", "backend", "prompt_tokens_per_s", "gen_tokens_per_s", "total_tokens_per_s"};
    def_record(stats, "Stats", stats_fields, stats_fields);

    auto cache_stats = py::class_<PrefixCacheStats>(m, "PrefixCacheStats",
                                                    "What a context's prefix cache holds and did.")
        .def_readonly("n_hits", &PrefixCacheStats::n_hits)
        .def_readonly("n_tokens_reused", &PrefixCacheStats::n_tokens_reused)
        .def_readonly("n_slots_held", &PrefixCacheStats::n_slots_held)
        .def_readonly("n_tokens_held", &PrefixCacheStats::n_tokens_held)
        .def_readonly("n_host_entries", &PrefixCacheStats::n_host_entries)
        .def_readonly("n_host_tokens", &PrefixCacheStats::n_host_tokens)
        .def_readonly("bytes_host", &PrefixCacheStats::bytes_host)
        .def_readonly("budget_bytes", &PrefixCacheStats::budget_bytes)
        .def_readonly("n_saved", &PrefixCacheStats::n_saved)
        .def_readonly("n_restored", &PrefixCacheStats::n_restored)
        .def_readonly("t_host_ms", &PrefixCacheStats::t_host_ms)
        .def_readonly("n_evicted", &PrefixCacheStats::n_evicted)
        .def_readonly("n_not_saved", &PrefixCacheStats::n_not_saved)
        .def_readonly("n_loaded", &PrefixCacheStats::n_loaded)
        .def_readonly("n_refused", &PrefixCacheStats::n_refused);
    const std::vector<const char *> cache_stats_fields = {
        "n_hits", "n_tokens_reused", "n_slots_held", "n_tokens_held", "n_host_entries", "n_host_tokens", "bytes_host",
        "budget_bytes", "n_saved", "n_restored", "t_host_ms", "n_evicted", "n_not_saved", "n_loaded",
        "n_refused"};
    def_record(cache_stats, "PrefixCacheStats", cache_stats_fields, cache_stats_fields);

    py::class_<Context>(m, "Context", "A llama.cpp context with n_parallel slots.")
        .def(py::init<std::shared_ptr<const Model>, const ContextParams &>(), py::arg("model"), py::arg("params"),
             py::call_guard<py::gil_scoped_release>())
        .def("generate", &generate, py::arg("prompts"), py::arg("params"), py::arg("on_completion") = py::none(),
             "Run every prompt (str, or list of ChatMessage) to completion with params (one GenerateParams\n"
             "for all, or one per prompt); results in input order, a prompt's n samples in turn.\n"
             "on_completion(index, completion) is called as each finishes, with its index in the results.")
        .def("embed", &embed, py::arg("prompts"), py::arg("normalize"), py::arg("on_completion") = py::none(),
             "Embed every text (an embeddings context): a float32 array of one row per text, in input\n"
             "order (NaN where a text failed), and each row's error or None.")
        .def_property_readonly("last_stats", &Context::last_stats)
        .def("seq_pos_max", &Context::seq_pos_max, "llama_memory_seq_pos_max of every slot (-1 = empty).",
             py::call_guard<py::gil_scoped_release>())
        .def("prefix_cache_stats", &Context::prefix_cache_stats)
        .def("clear_prefix_cache", &Context::clear_prefix_cache, py::call_guard<py::gil_scoped_release>())
        .def("save_prefix_cache", &Context::save_prefix_cache, py::call_guard<py::gil_scoped_release>())
        .def_property_readonly("prefix_cache_dir", [](const Context & c) { return c.params().prefix_cache_dir; })
        .def_property_readonly("prefix_cache_mib", [](const Context & c) { return c.params().prefix_cache_mib; })
        .def_property_readonly("n_ctx_per_seq", &Context::n_ctx_per_seq)
        .def_property_readonly("n_threads", &Context::n_threads)
        .def_property_readonly("n_parallel", [](const Context & c) { return c.params().n_parallel; })
        .def_property_readonly("n_batch", [](const Context & c) { return c.params().n_batch; })
        .def_property_readonly("kv_unified", [](const Context & c) { return c.params().kv_unified; })
        .def_property_readonly("device_sampling", &Context::device_sampling)
        .def_property_readonly("share_prefixes", [](const Context & c) { return c.params().share_prefixes; })
        .def_property_readonly("type_k", [](const Context & c) { return c.params().type_k; })
        .def_property_readonly("type_v", [](const Context & c) { return c.params().type_v; })
        .def_property_readonly("warmed_up", &Context::warmed_up)
        .def_property_readonly("embeddings", [](const Context & c) { return c.params().embeddings; })
        .def_property_readonly("pooling", &Context::pooling)
        .def_property_readonly("embedding_size", &Context::embedding_size);
}

}  // namespace fastpar::python
