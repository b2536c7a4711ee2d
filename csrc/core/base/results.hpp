// What a call gives back: each prompt's Completion (its text, tokens, log-probabilities
// and timings) and the call's Stats. Plain structs, as the options beside them
// (params.hpp); the C ABI and the bindings copy them out.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fastpar {

enum class FinishReason : int32_t {
    Stop = 0,       // end-of-generation token or a stop string
    Length = 1,     // max_tokens reached, or the sequence's context is full
    Error = 2,      // this prompt failed; see Completion::error
    Cancelled = 3,  // the call was interrupted before this prompt finished
    ToolCalls = 4,  // stopped after tool calls (GenerateParams::tool_parser found some)
};

const char * finish_reason_name(FinishReason reason);

// One tool call the output made (core/model/chat.hpp parses them).
struct ToolCall {
    std::string id;         // "call_" and 24 random characters, unless the model wrote one
    std::string name;
    std::string arguments;  // a JSON object, as text
};

struct TopLogprob {
    int32_t token = 0;
    float logprob = 0.0f;
    std::string text;  // the token's text, valid UTF-8 (a partial character becomes U+FFFD)
};

struct Completion {
    std::string text;                 // valid UTF-8 (invalid bytes replaced by U+FFFD)
    // With GenerateParams::reasoning "split": the thought (text is then the answer after it).
    std::string reasoning;
    std::vector<int32_t> token_ids;   // generated tokens, end-of-generation token excluded
    std::vector<float> logprobs;      // with GenerateParams::logprobs: log p(token) under the model
                                      // (softmax of the raw logits), one per token_ids entry
    // With GenerateParams::top_logprobs = k: for each token_ids entry, the k most likely
    // tokens under the model (same log-probabilities as `logprobs`), most likely first.
    std::vector<std::vector<TopLogprob>> top_logprobs;
    // With GenerateParams::prompt_logprobs: the prompt's tokens, each one's log-probability
    // given the ones before it (NaN for the first, and before prompt_logprobs_from), and
    // whether it was the most likely token there (the first of equal maxima).
    std::vector<int32_t> prompt_token_ids;
    std::vector<float> prompt_logprobs;
    std::vector<uint8_t> prompt_greedy;
    // With prompt_logprobs and top_logprobs = k: for each prompt_token_ids entry, the k most
    // likely tokens there, most likely first (empty where prompt_logprobs is NaN).
    std::vector<std::vector<TopLogprob>> prompt_top_logprobs;
    // Context::embed: the text's pooled vector (Context::embedding_size floats); empty when it
    // failed and for generation.
    std::vector<float> embedding;
    // With GenerateParams::tool_parser: the calls the output made (text is then what it
    // wrote besides them).
    std::vector<ToolCall> tool_calls;
    FinishReason finish_reason = FinishReason::Error;
    std::string error;                // empty unless finish_reason == Error
    int32_t n_prompt_tokens = 0;      // prompt tokens decoded for this prompt
    int32_t n_prompt_tokens_shared = 0;  // prompt tokens copied from another prompt's KV cache
                                         // instead (share_prefixes)
    int32_t n_prompt_tokens_cached = 0;  // prompt tokens whose KV an earlier request left in the
                                         // prefix cache; the prompt has the sum of the three
    int32_t n_gen_tokens = 0;         // == token_ids.size()
    double t_queued_ms = 0;           // submitted -> admitted into a slot
    double t_first_token_ms = 0;      // submitted -> first token sampled (0 = none was)
    double t_total_ms = 0;            // submitted -> finished
};

// Per-call statistics. Each llama_decode call's time is split between prompt and
// generation in proportion to the prompt and generated tokens it carried; sampling
// time counts as generation.
struct Stats {
    int64_t n_prompts = 0;        // prompts in the call
    int64_t n_failed = 0;         // prompts that ended with finish_reason "error"
    int64_t n_prompt_tokens = 0;  // prompt tokens decoded
    int64_t n_prompt_tokens_shared = 0;  // prompt tokens copied from another prompt's KV cache
    int64_t n_prompt_tokens_cached = 0;  // prompt tokens taken from the prefix cache
    int64_t n_gen_tokens = 0;     // tokens generated
    double t_prompt_ms = 0;       // time attributed to prompt processing
    double t_gen_ms = 0;          // time attributed to generation (decode + sampling)
    double t_wall_ms = 0;         // wall time of the whole call
    int64_t n_decode_calls = 0;   // llama_decode calls, retries included
    int64_t n_kv_full_retries = 0;  // llama_decode returned 1 (no KV room) and the batch was split
    int64_t n_device_sampled = 0;   // tokens chosen from candidates cut down on the device
    double t_sample_ms = 0;         // part of t_gen_ms spent choosing tokens from the logits
    int64_t n_padding_tokens = 0;   // throw-away tokens that kept a step in one forward pass (GPU)
    int64_t n_preempted = 0;        // running requests suspended for more urgent ones (priority)
    // Tokens of json_schema/grammar requests, by how each was chosen (core/structured/structured.hpp,
    // ConstrainedWay): the chain's choice kept; refused and found among the best 256
    // candidates; in larger stages; by masking the whole vocabulary; from a kept allowed set.
    int64_t n_grammar_kept = 0;
    int64_t n_grammar_top = 0;
    int64_t n_grammar_wider = 0;
    int64_t n_grammar_whole = 0;
    int64_t n_grammar_cached = 0;
    // The fewest threads llama.cpp computed a step of the call with: below the context's
    // n_threads when its threads had to wait for CPUs others held (thread_governor.hpp).
    int32_t n_threads_low = 0;

    double prompt_tokens_per_s() const { return t_prompt_ms > 0 ? 1e3 * static_cast<double>(n_prompt_tokens) / t_prompt_ms : 0.0; }
    double gen_tokens_per_s() const { return t_gen_ms > 0 ? 1e3 * static_cast<double>(n_gen_tokens) / t_gen_ms : 0.0; }
    double total_tokens_per_s() const {
        return t_wall_ms > 0 ? 1e3 * static_cast<double>(n_prompt_tokens + n_gen_tokens) / t_wall_ms : 0.0;
    }
};

}  // namespace fastpar
