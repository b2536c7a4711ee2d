// The one source of truth for every option of fastpar (results: results.hpp).
// The C ABI's *_default_params(), the Python keyword defaults and the R wrapper all
// start from these member initialisers; nothing else retypes a default.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/base/results.hpp"

namespace fastpar {

struct ModelParams {
    int32_t n_gpu_layers = 0;  // layers to offload to the GPU; -1 = all; > 0 needs a GPU build
    bool use_mmap = true;      // map the GGUF file instead of reading it into memory
};

// device_sampling=-1 (auto) cuts rows of logits down on the device when the model's output
// layer runs on a GPU and the context has at least this many slots: from there it beats
// host sampling, with one slot it loses (docs/performance.md, "Device sampling").
constexpr int32_t kAutoDeviceSamplingSlots = 8;

// n_batch=0 (auto) and llama.cpp's physical batch (n_ubatch = min(n_batch, this)). On the CPU
// larger physical batches grow the compute buffer for little gain; on a GPU each decode
// of a prompt batch costs about the same host time whatever its size, so fewer, larger
// ones take less (docs/performance.md, "Physical batch").
constexpr int32_t kCpuBatch = 512;
constexpr int32_t kGpuBatch = 2048;
// Tokens an embeddings step packs texts up to (SchedulerOptions::embed_step_tokens): a step's
// tokens all attend to one another, masked, so attention grows with the step while its matrix
// products gain little past this. On bge-small's shape 512 was fastest on a 2-core CPU (1.3x
// of 2,048), 512 and 1,024 alike on an H200 (1.30x of 2,048; 256: 0.74x): docs/internals.md.
constexpr int32_t kCpuEmbedStep = 512;
constexpr int32_t kGpuEmbedStep = 1024;

struct ContextParams {
    int32_t n_parallel = 8;        // slots: prompts decoded together (seq_id 0..n_parallel-1), 1..256
    int32_t n_ctx_per_seq = 2048;  // positions ONE prompt plus its generation may use; KV = n_parallel x this
    // Most tokens in one llama_decode call, >= n_parallel; 0 = auto: the larger of n_parallel
    // and kCpuBatch, or kGpuBatch when any layer runs on a GPU; for an embeddings context, the
    // larger of n_parallel and n_ctx_per_seq (or the model's training context if less).
    int32_t n_batch = 0;
    int32_t n_threads = 0;         // CPU threads; 0 = one per CPU this process may use (cpus.hpp)
    bool kv_unified = false;       // one KV buffer for all slots (helps shared prefixes, slower otherwise)
    // 1 = cut every row of logits down to its best candidates inside llama.cpp's graph, on
    // the device that runs the output layer, and finish each chain on the host from those
    // (device_sampling.hpp); 0 = copy whole rows back and sample on the host, many sequences
    // at once; -1 = auto: 1 with the output layer on a GPU and at least
    // kAutoDeviceSamplingSlots slots, else 0. Requests whose chain needs whole rows
    // (DeviceSampling::serves) get them either way.
    int32_t device_sampling = -1;
    // Prompts that start with the same tokens (at least kMinSharedPrefix of them) decode
    // that prefix once: the other slots copy it from the first one's KV cache.
    bool share_prefixes = true;
    // 1 = run a few decodes at creation, shaped like a call's (a prompt batch, then one
    // token a slot twice), and remove what they left in each slot, so that the first call
    // does not pay for the device's first use of this context (on a GPU, costs such as its
    // memory pool growing, library handles, graph captures); 0 = don't; -1 = auto: 1 when
    // any layer runs on a GPU, else 0 (on the CPU a first call costs no more than later ones).
    int32_t warmup = -1;
    // The KV cache's element types, one of kKvCacheTypes: "f16" is llama.cpp's default;
    // "q8_0" (8.5 bits a value) and "q4_0" (4.5) hold about 1.9x and 3.6x the positions in
    // the same memory, at a small cost in perplexity (docs/performance.md, "KV-cache types").
    // A quantized V cache needs flash attention, which llama.cpp then turns on.
    std::string type_k = "f16";
    std::string type_v = "f16";
    // The prefix cache (core/loop/prefix_cache.hpp): a finished request's KV stays cached and
    // later prompts that start with the same tokens decode only the rest. This is the most
    // host memory, in MiB, that cached sequences moved out of their slots may take; -1 = auto
    // (a quarter of the available memory, at most kAutoPrefixCacheMaxMib); 0 = off: every
    // request's KV is removed when it ends. Models whose memory cannot be trimmed by position
    // (recurrent, hybrid, sliding-window) cache nothing. Off by default: on the CPU a reused
    // prefix was computed in other batch shapes than a fresh decode, which llama.cpp's kernels
    // round differently, so a greedy output can part from the cache-off one where two tokens
    // are nearly tied (docs/internals.md, "The prefix cache"); a call's output would then
    // depend on the calls before it.
    int32_t prefix_cache_mib = 0;
    // A folder that keeps the prefix cache across restarts ("": none). The cache is written
    // there when the context is freed, an Engine closes, or on save_prefix_cache(), and read
    // back when a context is made with the same model file, KV types, fastpar and llama.cpp
    // builds; a file made by anything else is refused, never loaded. Needs the cache on.
    std::string prefix_cache_dir;
    // What the context is made for: false = generation; true = embeddings (Context::embed).
    // An embeddings context decodes every text whole in one physical batch (n_ubatch =
    // n_batch, one KV buffer: a text split over two batches would be pooled over part of it)
    // and pools its token vectors into one; it generates nothing, and a generation context
    // embeds nothing. The prefix cache does not apply (nothing is kept after a text).
    bool embeddings = false;
    // With embeddings: how a text's token vectors become one, one of kPoolings: "mean",
    // "cls" (the first token's), "last" (the last token's), "rank" (a reranker's score: the
    // model's classification head over the first token, or the last with causal attention);
    // "" = the model's own (its GGUF's pooling type), "mean" when the model names none (a
    // decoder made for generation).
    std::string pooling;
};

// The names ContextParams::pooling accepts besides "".
inline constexpr const char * kPoolings[] = {"mean", "cls", "last", "rank"};

// Context::embed's options.
struct EmbedParams {
    // Scale each vector to unit Euclidean length (as llama-embedding's default); a vector of
    // zeros stays zeros.
    bool normalize = true;
};

// prefix_cache_mib = -1: a quarter of the memory available when the context is made, at
// most this much (llama-server's --cache-ram default).
constexpr int64_t kAutoPrefixCacheMaxMib = 8192;
// The largest prefix_cache_mib accepted (1 TiB).
constexpr int32_t kMaxPrefixCacheMib = 1 << 20;

// The names type_k and type_v accept (ggml's names of the types).
inline constexpr const char * kKvCacheTypes[] = {"f16", "bf16", "f32", "q8_0", "q4_0"};

// Shorter common prefixes are decoded by every prompt (copying costs more than it saves).
constexpr int32_t kMinSharedPrefix = 16;

struct GenerateParams {
    int32_t max_tokens = 256;         // most new tokens per prompt; 0 = none (prompt is not decoded)
    float temperature = 0.8f;         // 0 = greedy
    int32_t top_k = 40;               // keep the k most likely tokens; 0 = off
    float top_p = 0.95f;              // nucleus sampling threshold; 1 = off
    float min_p = 0.05f;              // drop tokens below min_p x the best probability; 0 = off
    float repeat_penalty = 1.0f;      // penalise the last repeat_last_n tokens; 1 = off
    float presence_penalty = 0.0f;    // subtract for any token already present; 0 = off
    float frequency_penalty = 0.0f;   // subtract per occurrence of a token; 0 = off
    int32_t repeat_last_n = 64;       // how many recent tokens the penalties look at
    int64_t seed = -1;                // sampler seed, the same for every prompt; -1 = random
    std::vector<std::string> stop;    // stop strings: the text ends before the first match
    bool ignore_eos = false;          // keep generating past end-of-generation tokens
    bool logprobs = false;            // also return each token's log-probability (samples on the host)
    int32_t n = 1;                // samples per prompt: the prompt is decoded once, sample j seeded seed + j
    int32_t top_logprobs = 0;     // 0..20: the k most likely tokens and their log-probabilities at each position
    std::string json_schema;      // a JSON schema every output must validate against ("": none)
    std::string grammar;          // a GBNF grammar every output must match ("": none)
    // The output is exactly one of these strings (a grammar of their alternatives; empty: none).
    std::vector<std::string> choice;
    // (token id, bias) pairs added to those tokens' logits before sampling (OpenAI's logit_bias;
    // entries for one token add up); -infinity bans the token. The ids must be the model's.
    std::vector<std::pair<int32_t, float>> logit_bias;
    // Which queued request takes a free slot first: the lowest value, first come first served
    // among equals (vLLM's priority). A queued request more urgent than a running one
    // suspends the least urgent running one, which resumes where it stopped (preempt.cpp).
    int32_t priority = 0;
    // A regular expression every output matches whole (a grammar converted from it; "": none).
    std::string regex;
    // Only these tokens may be generated (vLLM's allowed_token_ids; empty: any). The output
    // can end early only if an end-of-generation token is among them.
    std::vector<int32_t> allowed_token_ids;
    // Thinking models' <think>...</think>: "split" puts a thought the output opens with (or
    // continues, when the prompt opened one) in Completion::reasoning and the answer after it
    // in text, and json_schema, grammar, choice and regex constrain the answer alone; "off"
    // closes an empty thought after a chat prompt, so the model answers at once; "": as is.
    std::string reasoning;
    // Tools (OpenAI's list of functions, as JSON text; "": none) for a chat prompt: it is
    // rendered with them by the model's template when admitted (render_tools,
    // core/loop/requests.hpp), which sets the fields below. tool_choice: "auto" ("" with
    // tools), "none", "required" or a function's name; parallel_tool_calls: several calls.
    std::string tools;
    std::string tool_choice;
    bool parallel_tool_calls = false;
    // Tool calls (ChatTemplates::render, core/model/chat.hpp, gives both): the text the
    // grammar reads before the output (the template's generation prompt, which a call
    // format's grammar starts with), and the parser that reads the output's calls into
    // Completion::tool_calls ("": none).
    std::string grammar_prefill;
    std::string tool_parser;
    // Scoring: each prompt token's log-probability given the tokens before it, in
    // Completion::prompt_logprobs. With max_tokens = 0 the prompt is scored and nothing is
    // generated (its last token is then never decoded: no logits are needed after it).
    bool prompt_logprobs = false;
    // With prompt_logprobs: the first prompt token scored (>= 1; earlier ones get NaN). The
    // positions before it need no logits and may be copied from another prompt's KV cache.
    int32_t prompt_logprobs_from = 1;
};

// The output is constrained (a JSON schema, a grammar, choices or a regex): the allowed
// tokens come from a grammar, which may allow none of a row's best candidates.
inline bool constrained(const GenerateParams & params) {
    return !params.json_schema.empty() || !params.grammar.empty() || !params.choice.empty() || !params.regex.empty();
}

// Most entries of GenerateParams::top_logprobs (as OpenAI's API allows).
constexpr int32_t kMaxTopLogprobs = 20;

// One chat message. An assistant's message may hold the calls it made (its content then
// empty, which the template reads as none) and a tool's result names the call it answers;
// only templates rendered with tools read those two (render_tools).
struct ChatMessage {
    std::string role;
    std::string content;
    std::vector<ToolCall> tool_calls;
    std::string tool_call_id;
};

// One prompt: raw text, chat messages rendered with the model's own template, or token ids
// fed as they are (each checked against the vocabulary when the prompt is admitted).
struct Prompt {
    std::string text;
    std::vector<ChatMessage> messages;
    bool is_chat = false;
    std::vector<int32_t> tokens;
    bool is_tokens = false;
};

// Throws InvalidArgument naming the first option out of range.
void validate(const ModelParams & params);
void validate(const ContextParams & params);
// The ranges only: a JSON schema is checked by check_params (core/loop/requests.hpp),
// which every door that takes GenerateParams calls.
void validate(const GenerateParams & params);

}  // namespace fastpar
