/*
 * fastpar_fields.h -- every option of fastpar's parameter structs, listed once, for the code
 * that converts them field by field: the C ABI (csrc/capi/fastpar_capi.cpp), the pybind11
 * module (csrc/python/) and the R glue (r/src/fastpar_r.c, which includes this file from
 * beside fastpar.h). Defaults are not here: they are the C++ structs' member initialisers
 * (csrc/core/base/params.hpp), the one source of truth.
 *
 * FASTPAR_<STRUCT>_FIELDS(X) calls X(name, KIND, C, PY, R) once per field of the C++ struct,
 * in its order:
 *   name  the field's name everywhere: the C++ struct, fastpar.h's struct, Python and R.
 *   KIND  INT32   int32_t (R: integer)
 *         INT64   int64_t (R: double)
 *         FLOAT   float (R: double)
 *         BOOL    bool (R: logical)
 *         STRING  C: const char *, NULL = the core's default; C++: std::string ("" = none where that
 *                 is the default); R: character, NA = the default
 *         STRINGS C: const char * const * name with int32_t n_<name>; C++: std::vector<std::string>;
 *                 R: a list of character vectors
 *         BIASES  C: const fastpar_logit_bias * name with int32_t n_<name>; C++:
 *                 std::vector<std::pair<int32_t, float>> (token id, bias); Python: a list of pairs;
 *                 R: a list of double vectors named by token ids
 *         TOKENS  C: const int32_t * name with int32_t n_<name>; C++: std::vector<int32_t> (token
 *                 ids); Python: a list of int; R: a list of integer vectors
 *   C     1: a field of fastpar.h's struct; 0: not in the C ABI.
 *   PY    1: a public Python option (fastpar.SamplingParams, or a keyword of Model() or of
 *         Context() and Engine()); 0: internal. Every field is an attribute of fastpar._core's
 *         params class either way.
 *   R     1: an option of the R package (its functions take it; fastpar_default_params()
 *         lists its default when the kind is a number or a logical); needs C = 1.
 * Adding an option: its field in params.hpp, its line here, its use in the core, the
 * declarations its flags ask for, and its docs (docs/design.md, "Adding an option").
 * tests/test_fields.py checks each language against this list.
 */
#ifndef FASTPAR_FIELDS_H
#define FASTPAR_FIELDS_H

/* FASTPAR_WHEN(flag, code): code when flag is 1, nothing when it is 0. */
#define FASTPAR_WHEN(flag, ...) FASTPAR_WHEN_##flag(__VA_ARGS__)
#define FASTPAR_WHEN_1(...) __VA_ARGS__
#define FASTPAR_WHEN_0(...)

/*                                 name                  KIND     C  PY R */
#define FASTPAR_MODEL_FIELDS(X)                                             \
    X(n_gpu_layers,         INT32,   1, 1, 1)                               \
    X(use_mmap,             BOOL,    1, 1, 1)

#define FASTPAR_CONTEXT_FIELDS(X)                                           \
    X(n_parallel,           INT32,   1, 1, 1)                               \
    X(n_ctx_per_seq,        INT32,   1, 1, 1)                               \
    X(n_batch,              INT32,   1, 1, 1)                               \
    X(n_threads,            INT32,   1, 1, 1)                               \
    X(kv_unified,           BOOL,    1, 1, 1)                               \
    X(device_sampling,      INT32,   1, 1, 1)                               \
    X(share_prefixes,       BOOL,    1, 1, 1)                               \
    X(warmup,               INT32,   1, 1, 1)                               \
    X(type_k,               STRING,  1, 1, 1)                               \
    X(type_v,               STRING,  1, 1, 1)                               \
    X(prefix_cache_mib,     INT32,   1, 1, 1)                               \
    X(prefix_cache_dir,     STRING,  1, 1, 1)                               \
    X(embeddings,           BOOL,    1, 1, 1)                               \
    X(pooling,              STRING,  1, 1, 1)

/* prompt_logprobs (scoring) is not in the C ABI; prompt_logprobs_from is set by fastpar's
 * scoring functions alone. */
#define FASTPAR_GENERATE_FIELDS(X)                                          \
    X(max_tokens,           INT32,   1, 1, 1)                               \
    X(temperature,          FLOAT,   1, 1, 1)                               \
    X(top_k,                INT32,   1, 1, 1)                               \
    X(top_p,                FLOAT,   1, 1, 1)                               \
    X(min_p,                FLOAT,   1, 1, 1)                               \
    X(repeat_penalty,       FLOAT,   1, 1, 1)                               \
    X(presence_penalty,     FLOAT,   1, 1, 1)                               \
    X(frequency_penalty,    FLOAT,   1, 1, 1)                               \
    X(repeat_last_n,        INT32,   1, 1, 1)                               \
    X(seed,                 INT64,   1, 1, 1)                               \
    X(stop,                 STRINGS, 1, 1, 1)                               \
    X(ignore_eos,           BOOL,    1, 1, 1)                               \
    X(logprobs,             BOOL,    1, 1, 1)                               \
    X(n,                    INT32,   1, 1, 1)                               \
    X(top_logprobs,         INT32,   1, 1, 1)                               \
    X(json_schema,          STRING,  1, 1, 1)                               \
    X(grammar,              STRING,  1, 1, 1)                               \
    X(choice,               STRINGS, 1, 1, 1)                               \
    X(logit_bias,           BIASES,  1, 1, 1)                               \
    X(priority,             INT32,   1, 1, 1)                               \
    X(regex,                STRING,  1, 1, 1)                               \
    X(allowed_token_ids,    TOKENS,  1, 1, 1)                               \
    X(reasoning,            STRING,  1, 1, 1)                               \
    X(tools,                STRING,  1, 1, 1)                               \
    X(tool_choice,          STRING,  1, 1, 1)                               \
    X(parallel_tool_calls,  BOOL,    1, 1, 1)                               \
    X(grammar_prefill,      STRING,  0, 0, 0)                               \
    X(tool_parser,          STRING,  0, 0, 0)                               \
    X(prompt_logprobs,      BOOL,    0, 1, 0)                               \
    X(prompt_logprobs_from, INT32,   0, 0, 0)

#endif /* FASTPAR_FIELDS_H */
