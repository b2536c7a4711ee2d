/*
 * fastpar.h -- the C ABI of fastpar: many prompts through one llama.cpp model at once.
 *
 * Conventions (as in llama.h):
 *  - Opaque handles; every *_new / *_load has its *_free, and each free accepts NULL.
 *  - Parameter structs are passed by value and start from *_default_params().
 *  - Every function that can fail returns a fastpar_status; on failure the outputs are
 *    left untouched and fastpar_last_error() returns a message for the calling thread.
 *  - No C++ exception ever crosses this boundary.
 *  - Every call checks its handles against those this library made and has not freed: a
 *    freed or foreign handle gives FASTPAR_ERR_INVALID_ARGUMENT, and freeing one twice does
 *    nothing but set fastpar_last_error(). A handle of one kind never passes for another (a
 *    context given as a model), even where the allocator put the new one at a freed one's
 *    address; a freed handle whose address a new handle of the same kind took is that new
 *    handle. (Freeing a handle while another thread is inside a call with it is still an
 *    error of the caller.) Pointers to caller memory (prompts,
 *    stop strings) must point to as many valid entries as their counts say.
 *
 * Thread safety: a model may be shared by several contexts used from several threads;
 * concurrent generate calls on ONE context are serialised (they take turns).
 */
#ifndef FASTPAR_H
#define FASTPAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define FASTPAR_API __declspec(dllexport)
#else
#define FASTPAR_API __attribute__((visibility("default")))
#endif

typedef struct fastpar_model fastpar_model;
typedef struct fastpar_context fastpar_context;

typedef enum fastpar_status {
    FASTPAR_OK = 0,
    FASTPAR_ERR_INVALID_ARGUMENT = 1, /* a NULL pointer, a size or an option out of range */
    FASTPAR_ERR_NOT_FOUND = 2,        /* the model file does not exist */
    FASTPAR_ERR_MODEL_LOAD = 3,       /* the file is not a model llama.cpp can load */
    FASTPAR_ERR_RUNTIME = 4,          /* llama.cpp failed (context creation, ...) */
    FASTPAR_ERR_OUT_OF_MEMORY = 5,
    FASTPAR_ERR_INTERRUPTED = 6,      /* the context's interrupt callback stopped the call */
} fastpar_status;

typedef enum fastpar_finish_reason {
    FASTPAR_FINISH_STOP = 0,      /* end-of-generation token or a stop string */
    FASTPAR_FINISH_LENGTH = 1,    /* max_tokens reached, or the sequence's context is full */
    FASTPAR_FINISH_ERROR = 2,     /* this prompt failed; see fastpar_completion.error */
    FASTPAR_FINISH_CANCELLED = 3, /* the call was interrupted before this prompt finished */
    FASTPAR_FINISH_TOOL_CALLS = 4, /* the output made tool calls (fastpar_completion.tool_calls) */
} fastpar_finish_reason;

/* Field meanings and defaults: see fastpar_*_default_params() (one source of truth). */
typedef struct fastpar_model_params {
    int32_t n_gpu_layers; /* -1 = all; > 0 needs a GPU build */
    bool use_mmap;
} fastpar_model_params;

typedef struct fastpar_context_params {
    int32_t n_parallel;    /* slots decoded together, 1..256 */
    int32_t n_ctx_per_seq; /* positions one prompt plus its generation may use */
    int32_t n_batch;       /* most tokens per llama_decode call, >= n_parallel; 0 = auto (the larger
                              of n_parallel and 512, or 2048 with a layer on a GPU) */
    int32_t n_threads;     /* 0 = one per CPU this process may use */
    bool kv_unified;
    int32_t device_sampling; /* 1 cut logits down to candidates in the graph, 0 whole rows to the
                                host, -1 auto (1 with the output layer on a GPU and >= 8 slots) */
    bool share_prefixes;     /* decode a prefix common to several prompts once */
    int32_t warmup;          /* 1 warm-up decodes at creation, 0 none, -1 auto (1 with a layer on a GPU) */
    /* The KV cache's K and V types: "f16" (the default; NULL = the default), "bf16", "f32",
       "q8_0" or "q4_0". A quantized V cache turns flash attention on. */
    const char * type_k;
    const char * type_v;
    /* The prefix cache: a finished prompt's KV stays cached, so later prompts that start with
       the same tokens decode only the rest. The most host memory (MiB) cached sequences moved
       out of their slots may take: -1 auto (a quarter of the available memory, at most
       8192), 0 off (the default: every prompt's KV is removed when it ends). */
    int32_t prefix_cache_mib;
    /* A folder keeping the prefix cache across restarts (NULL: none): written when the context
       is freed, read back by a context of the same model file, KV types and builds; files
       made by anything else are refused. Needs prefix_cache_mib != 0. */
    const char * prefix_cache_dir;
    /* true: a context for fastpar_embed instead of generation (each text decoded whole in one
       batch; it generates nothing, and a generation context embeds nothing). */
    bool embeddings;
    /* With embeddings: "mean", "cls", "last" or "rank" (a reranker: each result's embedding is
       its classification outputs, the score first, for the text as given); NULL = the
       model's own, else "mean". */
    const char * pooling;
} fastpar_context_params;

/* A bias added to one token's logit before sampling (OpenAI's logit_bias). */
typedef struct fastpar_logit_bias {
    int32_t token;
    float bias;
} fastpar_logit_bias;

typedef struct fastpar_generate_params {
    int32_t max_tokens;
    float temperature; /* 0 = greedy */
    int32_t top_k;     /* 0 = off */
    float top_p;       /* 1 = off */
    float min_p;       /* 0 = off */
    float repeat_penalty;
    float presence_penalty;
    float frequency_penalty;
    int32_t repeat_last_n;
    int64_t seed;              /* -1 = random */
    const char * const * stop; /* n_stop NUL-terminated stop strings, or NULL */
    int32_t n_stop;
    bool ignore_eos;
    bool logprobs;             /* fill fastpar_completion.logprobs */
    int32_t n;                 /* samples per prompt (fastpar_generate): the prompt is decoded once,
                                  sample j seeded seed + j */
    int32_t top_logprobs;      /* 0..20: fill fastpar_completion.top_logprob_ids / _values */
    const char * json_schema;  /* JSON schema every output validates against, or NULL */
    const char * grammar;      /* GBNF grammar every output matches, or NULL */
    const char * const * choice; /* n_choice non-empty strings, one of which is every output, or
                                    NULL */
    int32_t n_choice;
    const fastpar_logit_bias * logit_bias; /* n_logit_bias entries added to their tokens' logits
                                              before sampling (entries for one token add up;
                                              -INFINITY bans it), or NULL */
    int32_t n_logit_bias;
    int32_t priority;          /* lowest first: which queued prompt takes a free slot first
                                  (first come first served among equals), and one more urgent
                                  than a running prompt suspends the least urgent running one,
                                  which resumes where it stopped; 0 by default */
    const char * regex;        /* regular expression every output matches whole, or NULL; at
                                  most one of json_schema, grammar, choice and regex */
    const int32_t * allowed_token_ids; /* n_allowed_token_ids token ids, the only ones generated
                                          (an end-of-generation token must be among them for the
                                          output to end early), or NULL: any */
    int32_t n_allowed_token_ids;
    const char * reasoning;    /* "split": a <think> thought goes to fastpar_completion.reasoning,
                                  constraints apply to the answer after it; "off": a chat
                                  prompt's thought is closed empty; NULL: the output as is */
    const char * tools;        /* OpenAI's tools as JSON text (an array of functions, each with
                                  type "function" and a function object holding name,
                                  description and parameters), or NULL: chat
                                  prompts are rendered with them by the model's template, and
                                  the calls the output makes come back in
                                  fastpar_completion.tool_calls (finish reason TOOL_CALLS);
                                  not with json_schema, grammar, choice or regex */
    const char * tool_choice;  /* "auto" (NULL), "none", "required" or a function's name: the
                                  last two constrain the output to a call */
    bool parallel_tool_calls;  /* allow several calls in one output */
} fastpar_generate_params;

/* One tool call: an output's (owned by the results) or an earlier assistant turn's. */
typedef struct fastpar_tool_call {
    const char * id;
    const char * name;
    const char * arguments; /* a JSON object, as text */
} fastpar_tool_call;

/* One chat message; a prompt of messages is rendered with the model's own chat template. */
typedef struct fastpar_message {
    const char * role;    /* "system", "user", "assistant", "tool", ... */
    const char * content; /* NULL only for an assistant's message with tool calls */
    const fastpar_tool_call * tool_calls; /* an assistant's n_tool_calls calls, or NULL */
    int32_t n_tool_calls;
    const char * tool_call_id; /* role "tool": the id of the call this result answers, or NULL */
} fastpar_message;

/* One prompt for fastpar_generate: raw text, or chat messages (text NULL). */
typedef struct fastpar_prompt {
    const char * text;                /* NUL-terminated raw text, or NULL */
    const fastpar_message * messages; /* n_messages messages when text is NULL */
    int32_t n_messages;
} fastpar_prompt;

typedef struct fastpar_completion {
    char * text;        /* NUL-terminated UTF-8, owned by the results */
    size_t text_len;    /* bytes, without the NUL */
    int32_t * token_ids;
    int32_t n_gen_tokens; /* entries in token_ids */
    int32_t n_prompt_tokens;        /* prompt tokens decoded for this prompt */
    int32_t n_prompt_tokens_shared; /* prompt tokens copied from another prompt's KV cache */
    int32_t n_prompt_tokens_cached; /* prompt tokens an earlier prompt left in the prefix cache */
    fastpar_finish_reason finish_reason;
    char * error;       /* NULL unless finish_reason == FASTPAR_FINISH_ERROR */
    float * logprobs;   /* n_gen_tokens log-probabilities, or NULL unless logprobs was asked for */
    int32_t n_top_logprobs;     /* k = top_logprobs asked for (0: the arrays below are NULL) */
    int32_t * top_logprob_ids;  /* n_gen_tokens x k token ids: position i's k most likely tokens,
                                   most likely first, at [i * k, i * k + k) */
    float * top_logprob_values; /* their log-probabilities, laid out the same way */
    float * embedding;          /* fastpar_embed: the text's n_embedding floats (fastpar_rerank: the
                                   score first); NULL otherwise and when the text failed */
    int32_t n_embedding;
    char * reasoning;           /* reasoning "split": the thought (NUL-terminated UTF-8; text is then
                                   the answer after it), or NULL when there was none */
    fastpar_tool_call * tool_calls; /* with tools: the n_tool_calls calls the output made (text is
                                       then what it wrote besides them), or NULL */
    int32_t n_tool_calls;
} fastpar_completion;

typedef struct fastpar_stats {
    int64_t n_prompts;
    int64_t n_failed;
    int64_t n_prompt_tokens;        /* decoded */
    int64_t n_prompt_tokens_shared; /* copied from another prompt's KV cache */
    int64_t n_prompt_tokens_cached; /* taken from the prefix cache */
    int64_t n_gen_tokens;
    double t_prompt_ms;
    double t_gen_ms;
    double t_wall_ms;
    double prompt_tokens_per_s;
    double gen_tokens_per_s;
    double total_tokens_per_s;
    int64_t n_decode_calls;
    int64_t n_kv_full_retries;
    int64_t n_device_sampled; /* tokens chosen from candidates cut down on the device */
    double t_sample_ms;       /* part of t_gen_ms spent choosing tokens from the logits */
    int64_t n_padding_tokens; /* throw-away tokens that kept a step in one forward pass (GPU) */
} fastpar_stats;

FASTPAR_API const char * fastpar_version(void);
/* "cpu", "cuda" or "metal": the backend this library was built for. */
FASTPAR_API const char * fastpar_backend(void);
/* The message of the last failed call on this thread ("" if none). Valid until the next
 * fastpar call on this thread. */
FASTPAR_API const char * fastpar_last_error(void);
/* "stop", "length", "error", "cancelled" or "tool_calls" (the names Python uses); "unknown"
 * otherwise. */
FASTPAR_API const char * fastpar_finish_reason_name(fastpar_finish_reason reason);

FASTPAR_API fastpar_model_params fastpar_model_default_params(void);
FASTPAR_API fastpar_context_params fastpar_context_default_params(void);
FASTPAR_API fastpar_generate_params fastpar_generate_default_params(void);

/* Loads a GGUF model into *model_out. Returns FASTPAR_ERR_NOT_FOUND for a missing file,
 * FASTPAR_ERR_MODEL_LOAD for a file llama.cpp cannot load. */
FASTPAR_API fastpar_status fastpar_model_load(const char * path, fastpar_model_params params,
                                              fastpar_model ** model_out);
/* A model stays alive while contexts made from it exist; freeing it early is safe. */
FASTPAR_API void fastpar_model_free(fastpar_model * model);

FASTPAR_API fastpar_status fastpar_context_new(fastpar_model * model, fastpar_context_params params,
                                               fastpar_context ** ctx_out);
FASTPAR_API void fastpar_context_free(fastpar_context * ctx);

/* An interrupt check for the generate calls on ctx (Ctrl-C in a host language): polled on the
 * calling thread between steps. When it returns true, every prompt still unfinished is
 * cancelled, the context's KV cache is cleared, and the call returns FASTPAR_ERR_INTERRUPTED
 * with nothing allocated; the context stays usable. NULL (the default) removes it. Set it
 * while no generate call runs on ctx; user_data must stay valid while it is set. */
typedef bool (*fastpar_interrupt_fn)(void * user_data);
FASTPAR_API fastpar_status fastpar_context_set_interrupt(fastpar_context * ctx, fastpar_interrupt_fn fn,
                                                         void * user_data);

/* Runs n_prompts NUL-terminated prompts (raw text) in one unified batch and stores an
 * array of n_prompts completions, in input order, in *results_out (free it with
 * fastpar_results_free). A prompt that fails gets FASTPAR_FINISH_ERROR and a message
 * while the others complete; the call itself then still returns FASTPAR_OK. With
 * n_prompts == 0, *results_out is set to NULL. On an error status nothing is allocated. */
FASTPAR_API fastpar_status fastpar_generate_parallel(fastpar_context * ctx, const char * const * prompts,
                                                     int32_t n_prompts, fastpar_generate_params params,
                                                     fastpar_completion ** results_out);
/* The general form: prompts of raw text or chat messages, parameters per prompt, and n
 * samples per prompt. `params` is NULL (the defaults for every prompt) or points to
 * n_params structs: 1 (for every prompt) or n_prompts (one per prompt). A prompt whose
 * params have n samples gets n completions; *results_out holds *n_results_out of them,
 * every prompt's samples in turn (prompt 0's n, then prompt 1's, ...), each sample j
 * seeded seed + j. A seed of -1 is drawn once per params struct. Failures as for
 * fastpar_generate_parallel, which refuses n != 1 (its result has one entry a prompt). */
FASTPAR_API fastpar_status fastpar_generate(fastpar_context * ctx, const fastpar_prompt * prompts, int32_t n_prompts,
                                            const fastpar_generate_params * params, int32_t n_params,
                                            fastpar_completion ** results_out, int32_t * n_results_out);
/* Embeds n_texts NUL-terminated texts with a context made with embeddings = true, in one
 * unified batch, and stores n_texts results in input order in *results_out (free them with
 * fastpar_results_free): each holds its pooled vector in embedding (normalize: scaled to unit
 * length) and its n_prompt_tokens. A text that cannot be embedded (empty, not valid UTF-8,
 * longer than one batch) gets FASTPAR_FINISH_ERROR, a message and no vector, while the others
 * are computed; the call still returns FASTPAR_OK. With n_texts == 0, *results_out is NULL. */
FASTPAR_API fastpar_status fastpar_embed(fastpar_context * ctx, const char * const * texts, int32_t n_texts,
                                         bool normalize, fastpar_completion ** results_out);
/* Scores n_documents documents against query with a reranker context (embeddings = true,
 * pooling "rank", which a reranker's GGUF names), each pair made as llama-server's /rerank
 * makes it and all pairs in one unified batch; stores n_documents results in document order
 * in *results_out: result i's embedding[0] is document i's relevance score (the model's
 * classification output; n_embedding its outputs). A pair that cannot be scored (longer than
 * one batch, a document not valid UTF-8) fails alone as in fastpar_embed. A query that is not
 * valid UTF-8, or a context that does not rerank, is FASTPAR_ERR_INVALID_ARGUMENT. With
 * n_documents == 0, *results_out is NULL. */
FASTPAR_API fastpar_status fastpar_rerank(fastpar_context * ctx, const char * query, const char * const * documents,
                                          int32_t n_documents, fastpar_completion ** results_out);
/* n_results must be the count the call returned; a wrong one frees the whole array anyway
 * and sets fastpar_last_error(). */
FASTPAR_API void fastpar_results_free(fastpar_completion * results, int32_t n_results);

/* Statistics of the context's last generate call. */
FASTPAR_API fastpar_status fastpar_context_last_stats(const fastpar_context * ctx, fastpar_stats * stats_out);

#ifdef __cplusplus
}
#endif

#endif /* FASTPAR_H */
