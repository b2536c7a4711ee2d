/*
 * .Call glue over fastpar.h. The R functions (R/) check and coerce every argument first;
 * this file converts, calls the C ABI and copies results into R objects.
 *
 * Rules kept here:
 *  - Models and contexts are external pointers with finalizers: R's garbage collector
 *    frees them, and fastpar_r_free() frees them at once.
 *  - An R error (Rf_error, or an allocation that fails) longjmps out of C. So the external
 *    pointer that will own a fastpar resource is allocated BEFORE the resource and takes it
 *    at once; a failed fastpar call allocates nothing. Nothing fastpar made is ever left
 *    unowned.
 *  - A failed fastpar call returns a "fastpar_failure" (status and message) rather than
 *    raising: the R side turns it into a classed condition.
 *  - No longjmp may cross libfastpar's C++ frames: the interrupt check runs
 *    R_CheckUserInterrupt inside R_ToplevelExec, which catches the jump, and tells fastpar
 *    to stop; the R side then signals the interrupt.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <R.h>
#include <R_ext/Rdynload.h>
#include <Rinternals.h>

#include "config.h"
#include "fastpar.h"
#include "fastpar_fields.h"
#include "fastpar_r.h"

/* ---- handles ---------------------------------------------------------------------- */

static SEXP model_tag(void) { return Rf_install("fastpar_model"); }
SEXP context_tag(void) { return Rf_install("fastpar_context"); }

static void model_finalizer(SEXP ptr) {
    fastpar_model_free((fastpar_model *) R_ExternalPtrAddr(ptr));
    R_ClearExternalPtr(ptr);
}

static void context_finalizer(SEXP ptr) {
    fastpar_context_free((fastpar_context *) R_ExternalPtrAddr(ptr));
    R_ClearExternalPtr(ptr);
}

void results_finalizer(SEXP ptr) {
    fastpar_results_free((fastpar_completion *) R_ExternalPtrAddr(ptr),
                         Rf_asInteger(R_ExternalPtrProtected(ptr)));
    R_ClearExternalPtr(ptr);
}

/* An empty owner for a resource still to be made; its finalizer frees whatever it holds. */
SEXP owner(SEXP tag, SEXP keep, R_CFinalizer_t finalizer) {
    SEXP ptr = PROTECT(R_MakeExternalPtr(NULL, tag, keep));
    R_RegisterCFinalizerEx(ptr, finalizer, TRUE);
    UNPROTECT(1);
    return ptr;
}

void * handle(SEXP ptr, SEXP tag, const char * what) {
    if (TYPEOF(ptr) != EXTPTRSXP || R_ExternalPtrTag(ptr) != tag) {
        Rf_error("expected a fastpar %s", what);
    }
    void * p = R_ExternalPtrAddr(ptr);
    if (p == NULL) {
        Rf_error("this fastpar %s has been freed", what);
    }
    return p;
}

static const char * status_name(fastpar_status status) {
    switch (status) {
        case FASTPAR_OK: return "ok";
        case FASTPAR_ERR_INVALID_ARGUMENT: return "invalid_argument";
        case FASTPAR_ERR_NOT_FOUND: return "not_found";
        case FASTPAR_ERR_MODEL_LOAD: return "model_load";
        case FASTPAR_ERR_RUNTIME: return "runtime";
        case FASTPAR_ERR_OUT_OF_MEMORY: return "out_of_memory";
        case FASTPAR_ERR_INTERRUPTED: return "interrupted";
    }
    return "unknown";
}

/* list(status = , message = ) of class "fastpar_failure", made right after the failed call
 * (fastpar_last_error() is valid until the next fastpar call on this thread). */
SEXP failure(fastpar_status status) {
    const char * names[] = {"status", "message", ""};
    SEXP out = PROTECT(Rf_mkNamed(VECSXP, names));
    SET_VECTOR_ELT(out, 0, Rf_mkString(status_name(status)));
    SET_VECTOR_ELT(out, 1, Rf_ScalarString(Rf_mkCharCE(fastpar_last_error(), CE_UTF8)));
    Rf_setAttrib(out, R_ClassSymbol, Rf_mkString("fastpar_failure"));
    UNPROTECT(1);
    return out;
}

/* ---- options: a named list, each entry of length 1 (for all) or one per prompt ------ */

static SEXP option(SEXP opts, const char * name) {
    SEXP names = Rf_getAttrib(opts, R_NamesSymbol);
    for (R_xlen_t i = 0; i < Rf_xlength(opts); ++i) {
        if (strcmp(CHAR(STRING_ELT(names, i)), name) == 0) {
            return VECTOR_ELT(opts, i);
        }
    }
    return R_NilValue;
}

static R_xlen_t at(SEXP x, R_xlen_t i) { return Rf_xlength(x) == 1 ? 0 : i; }
static int int_at(SEXP x, R_xlen_t i) { return INTEGER(x)[at(x, i)]; }
static double real_at(SEXP x, R_xlen_t i) { return REAL(x)[at(x, i)]; }
static bool lgl_at(SEXP x, R_xlen_t i) { return LOGICAL(x)[at(x, i)] == TRUE; }

/* The options R passes (R = 1 in fastpar_fields.h), each with where it lies in its C struct,
 * so that one loop converts them all. R/ coerces every option to its kind's R type first. */
typedef enum { KIND_INT32, KIND_INT64, KIND_FLOAT, KIND_BOOL, KIND_STRING, KIND_STRINGS, KIND_BIASES, KIND_TOKENS } field_kind;

typedef struct {
    const char * name;
    field_kind kind;
    size_t offset;
    size_t count_offset; /* STRINGS, BIASES, TOKENS: where n_<name> lies */
} r_field;

#define OPT_COUNT_INT32(S, name) 0
#define OPT_COUNT_INT64(S, name) 0
#define OPT_COUNT_FLOAT(S, name) 0
#define OPT_COUNT_BOOL(S, name) 0
#define OPT_COUNT_STRING(S, name) 0
#define OPT_COUNT_STRINGS(S, name) offsetof(S, n_##name)
#define OPT_COUNT_BIASES(S, name) offsetof(S, n_##name)
#define OPT_COUNT_TOKENS(S, name) offsetof(S, n_##name)
#define OPT_FIELD(name, kind, c, py, r) \
    FASTPAR_WHEN(r, {#name, KIND_##kind, offsetof(OPT_STRUCT, name), OPT_COUNT_##kind(OPT_STRUCT, name)},)

#define OPT_STRUCT fastpar_model_params
static const r_field model_fields[] = {FASTPAR_MODEL_FIELDS(OPT_FIELD)};
#undef OPT_STRUCT
#define OPT_STRUCT fastpar_context_params
static const r_field context_fields[] = {FASTPAR_CONTEXT_FIELDS(OPT_FIELD)};
#undef OPT_STRUCT
#define OPT_STRUCT fastpar_generate_params
static const r_field generate_fields[] = {FASTPAR_GENERATE_FIELDS(OPT_FIELD)};
#undef OPT_STRUCT
#define N_FIELDS(fields) (sizeof fields / sizeof fields[0])

/* Sets field f of the struct at `params` from x's entry for prompt i. A string NA is none
 * (NULL); strings live in R-owned memory (R_alloc), released by R even on an error. */
static void set_field(void * params, const r_field * f, SEXP x, R_xlen_t i) {
    char * p = (char *) params + f->offset;
    switch (f->kind) {
        case KIND_INT32: *(int32_t *) p = int_at(x, i); break;
        case KIND_INT64: *(int64_t *) p = (int64_t) real_at(x, i); break;
        case KIND_FLOAT: *(float *) p = (float) real_at(x, i); break;
        case KIND_BOOL: *(bool *) p = lgl_at(x, i); break;
        case KIND_STRING: {
            SEXP s = STRING_ELT(x, at(x, i));
            *(const char **) p = s != NA_STRING ? Rf_translateCharUTF8(s) : NULL;
            break;
        }
        case KIND_STRINGS: {
            SEXP s = VECTOR_ELT(x, at(x, i));
            const int n = Rf_length(s);
            const char ** strings = (const char **) R_alloc((size_t) n + 1, sizeof(char *));
            for (int k = 0; k < n; ++k) {
                strings[k] = Rf_translateCharUTF8(STRING_ELT(s, k));
            }
            *(const char * const **) p = n > 0 ? strings : NULL;
            *(int32_t *) ((char *) params + f->count_offset) = n;
            break;
        }
        case KIND_BIASES: { /* a double vector named by token ids (R/ checked the names) */
            SEXP b = VECTOR_ELT(x, at(x, i));
            SEXP names = Rf_getAttrib(b, R_NamesSymbol);
            const int n = Rf_length(b);
            fastpar_logit_bias * biases = (fastpar_logit_bias *) R_alloc((size_t) n + 1, sizeof(fastpar_logit_bias));
            for (int k = 0; k < n; ++k) {
                biases[k].token = (int32_t) strtol(CHAR(STRING_ELT(names, k)), NULL, 10);
                biases[k].bias = (float) REAL(b)[k];
            }
            *(const fastpar_logit_bias **) p = n > 0 ? biases : NULL;
            *(int32_t *) ((char *) params + f->count_offset) = n;
            break;
        }
        case KIND_TOKENS: { /* an integer vector of token ids */
            SEXP t = VECTOR_ELT(x, at(x, i));
            const int n = Rf_length(t);
            int32_t * tokens = (int32_t *) R_alloc((size_t) n + 1, sizeof(int32_t));
            for (int k = 0; k < n; ++k) {
                tokens[k] = (int32_t) INTEGER(t)[k];
            }
            *(const int32_t **) p = n > 0 ? tokens : NULL;
            *(int32_t *) ((char *) params + f->count_offset) = n;
            break;
        }
    }
}

/* Sets every option `opts` names (one value each) in the struct at `params`. */
static void set_options(void * params, const r_field * fields, size_t n_fields, SEXP opts) {
    for (size_t k = 0; k < n_fields; ++k) {
        SEXP x = option(opts, fields[k].name);
        if (x != R_NilValue) {
            set_field(params, &fields[k], x, 0);
        }
    }
}

/* The defaults of the numeric and logical options of a struct, as a named list. */
static SEXP defaults_list(const void * params, const r_field * fields, size_t n_fields) {
    int n = 0;
    for (size_t k = 0; k < n_fields; ++k) {
        n += fields[k].kind == KIND_INT32 || fields[k].kind == KIND_INT64 || fields[k].kind == KIND_FLOAT ||
             fields[k].kind == KIND_BOOL;
    }
    SEXP out = PROTECT(Rf_allocVector(VECSXP, n));
    SEXP names = PROTECT(Rf_allocVector(STRSXP, n));
    int j = 0;
    for (size_t k = 0; k < n_fields; ++k) {
        const char * p = (const char *) params + fields[k].offset;
        SEXP value;
        switch (fields[k].kind) {
            case KIND_INT32: value = Rf_ScalarInteger(*(const int32_t *) p); break;
            case KIND_INT64: value = Rf_ScalarReal((double) *(const int64_t *) p); break;
            case KIND_FLOAT: value = Rf_ScalarReal(*(const float *) p); break;
            case KIND_BOOL: value = Rf_ScalarLogical(*(const bool *) p); break;
            default: continue;
        }
        SET_VECTOR_ELT(out, j, value);
        SET_STRING_ELT(names, j, Rf_mkChar(fields[k].name));
        ++j;
    }
    Rf_setAttrib(out, R_NamesSymbol, names);
    UNPROTECT(2);
    return out;
}

/* ---- interrupts ------------------------------------------------------------------- */

/* How often a generate call looks for a pending Ctrl-C. */
#define POLL_INTERVAL_S 0.05
double g_next_poll;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double) t.tv_sec + 1e-9 * (double) t.tv_nsec;
}

static void check_interrupt(void * unused) {
    (void) unused;
    R_CheckUserInterrupt();
}

/* fastpar's interrupt check: true when R has a pending interrupt (R_ToplevelExec returns
 * FALSE when R_CheckUserInterrupt jumped). Called on R's thread, between steps. */
static bool interrupt_pending(void * unused) {
    (void) unused;
    const double t = now_s();
    if (t < g_next_poll) {
        return false;
    }
    g_next_poll = t + POLL_INTERVAL_S;
    return !R_ToplevelExec(check_interrupt, NULL);
}

/* ---- entry points ----------------------------------------------------------------- */

static SEXP fastpar_r_info(void) {
    const char * names[] = {"version", "backend", "include", "library", "python", ""};
    SEXP out = PROTECT(Rf_mkNamed(VECSXP, names));
    SET_VECTOR_ELT(out, 0, Rf_mkString(fastpar_version()));
    SET_VECTOR_ELT(out, 1, Rf_mkString(fastpar_backend()));
    SET_VECTOR_ELT(out, 2, Rf_mkString(FASTPAR_R_INCLUDE));
    SET_VECTOR_ELT(out, 3, Rf_mkString(FASTPAR_R_LIBRARY));
    SET_VECTOR_ELT(out, 4, Rf_mkString(FASTPAR_R_PYTHON));
    UNPROTECT(1);
    return out;
}

/* fastpar_*_default_params() as R lists: the one source of every default. */
static SEXP fastpar_r_default_params(void) {
    const fastpar_model_params mp = fastpar_model_default_params();
    const fastpar_context_params cp = fastpar_context_default_params();
    const fastpar_generate_params gp = fastpar_generate_default_params();
    const char * top[] = {"model", "context", "generate", ""};
    SEXP out = PROTECT(Rf_mkNamed(VECSXP, top));
    SET_VECTOR_ELT(out, 0, defaults_list(&mp, model_fields, N_FIELDS(model_fields)));
    SET_VECTOR_ELT(out, 1, defaults_list(&cp, context_fields, N_FIELDS(context_fields)));
    SET_VECTOR_ELT(out, 2, defaults_list(&gp, generate_fields, N_FIELDS(generate_fields)));
    UNPROTECT(1);
    return out;
}

/* opts: any fastpar_model_params field R passes, each one value of the field's kind. */
static SEXP fastpar_r_model_load(SEXP path, SEXP opts) {
    fastpar_model_params mp = fastpar_model_default_params();
    set_options(&mp, model_fields, N_FIELDS(model_fields), opts);
    const char * file = Rf_translateCharUTF8(STRING_ELT(path, 0));
    SEXP ptr = PROTECT(owner(model_tag(), R_NilValue, model_finalizer));
    fastpar_model * model = NULL;
    const fastpar_status st = fastpar_model_load(file, mp, &model);
    if (st != FASTPAR_OK) {
        UNPROTECT(1);
        return failure(st); /* nothing was allocated */
    }
    R_SetExternalPtrAddr(ptr, model);
    UNPROTECT(1);
    return ptr;
}

/* opts: any fastpar_context_params field R passes, each one value of the field's kind. */
static SEXP fastpar_r_context_new(SEXP model_ptr, SEXP opts) {
    fastpar_model * model = (fastpar_model *) handle(model_ptr, model_tag(), "model");
    fastpar_context_params cp = fastpar_context_default_params();
    set_options(&cp, context_fields, N_FIELDS(context_fields), opts);
    /* The context keeps its model alive on the C side; the R handle keeps the model's too. */
    SEXP ptr = PROTECT(owner(context_tag(), model_ptr, context_finalizer));
    fastpar_context * ctx = NULL;
    fastpar_status st = fastpar_context_new(model, cp, &ctx);
    if (st != FASTPAR_OK) {
        UNPROTECT(1);
        return failure(st);
    }
    R_SetExternalPtrAddr(ptr, ctx);
    st = fastpar_context_set_interrupt(ctx, interrupt_pending, NULL);
    UNPROTECT(1);
    return st == FASTPAR_OK ? ptr : failure(st); /* a failure here leaves ctx to the finalizer */
}

/* TRUE when the handle was freed now, FALSE when it was freed already. */
static SEXP fastpar_r_free(SEXP ptr) {
    if (TYPEOF(ptr) != EXTPTRSXP ||
        (R_ExternalPtrTag(ptr) != model_tag() && R_ExternalPtrTag(ptr) != context_tag())) {
        Rf_error("expected a fastpar model or context");
    }
    const bool live = R_ExternalPtrAddr(ptr) != NULL;
    if (R_ExternalPtrTag(ptr) == model_tag()) {
        model_finalizer(ptr);
    } else {
        context_finalizer(ptr);
    }
    return Rf_ScalarLogical(live);
}

static SEXP fastpar_r_is_live(SEXP ptr) {
    return Rf_ScalarLogical(TYPEOF(ptr) == EXTPTRSXP && R_ExternalPtrAddr(ptr) != NULL);
}

SEXP stats_list(const fastpar_stats * s) {
    const char * names[] = {"n_prompts", "n_failed", "n_prompt_tokens", "n_prompt_tokens_shared",
                            "n_prompt_tokens_cached", "n_gen_tokens",
                            "t_prompt_ms", "t_gen_ms", "t_wall_ms", "prompt_tokens_per_s", "gen_tokens_per_s",
                            "total_tokens_per_s", "n_decode_calls", "n_kv_full_retries", "n_device_sampled",
                            "t_sample_ms", "n_padding_tokens", ""};
    const double values[] = {(double) s->n_prompts, (double) s->n_failed, (double) s->n_prompt_tokens,
                             (double) s->n_prompt_tokens_shared, (double) s->n_prompt_tokens_cached,
                             (double) s->n_gen_tokens, s->t_prompt_ms,
                             s->t_gen_ms, s->t_wall_ms, s->prompt_tokens_per_s, s->gen_tokens_per_s,
                             s->total_tokens_per_s, (double) s->n_decode_calls, (double) s->n_kv_full_retries,
                             (double) s->n_device_sampled, s->t_sample_ms, (double) s->n_padding_tokens};
    SEXP out = PROTECT(Rf_mkNamed(VECSXP, names));
    for (int i = 0; i < (int) (sizeof values / sizeof values[0]); ++i) {
        SET_VECTOR_ELT(out, i, Rf_ScalarReal(values[i]));
    }
    UNPROTECT(1);
    return out;
}

static SEXP fastpar_r_last_stats(SEXP ctx_ptr) {
    fastpar_context * ctx = (fastpar_context *) handle(ctx_ptr, context_tag(), "context");
    fastpar_stats s;
    const fastpar_status st = fastpar_context_last_stats(ctx, &s);
    return st == FASTPAR_OK ? stats_list(&s) : failure(st);
}

/* A row's top_logprobs: list(token_ids = , logprobs = ), two n_gen_tokens x k matrices
 * (row t: position t's k most likely tokens, best first). The C arrays are row-major. */
static SEXP top_logprobs_entry(const fastpar_completion * c) {
    const int32_t n = c->n_gen_tokens, k = c->n_top_logprobs;
    const char * names[] = {"token_ids", "logprobs", ""};
    SEXP entry = PROTECT(Rf_mkNamed(VECSXP, names));
    SEXP ids = Rf_allocMatrix(INTSXP, n, k);
    SET_VECTOR_ELT(entry, 0, ids);
    SEXP values = Rf_allocMatrix(REALSXP, n, k);
    SET_VECTOR_ELT(entry, 1, values);
    for (int32_t t = 0; t < n; ++t) {
        for (int32_t j = 0; j < k; ++j) {
            const size_t from = (size_t) t * (size_t) k + (size_t) j, to = (size_t) j * (size_t) n + (size_t) t;
            INTEGER(ids)[to] = c->top_logprob_ids[from];
            REAL(values)[to] = c->top_logprob_values[from];
        }
    }
    UNPROTECT(1);
    return entry;
}

/* prompts: a list, each entry one string (raw text) or a chat (r_prompts, fastpar_r_chat.c
 * reads them). opts: generation options by name, each of length 1 or length(prompts),
 * of its kind's R type (fastpar_fields.h: stop a list of character vectors, json_schema and
 * grammar character with NA for none). per_prompt: TRUE to pass one params struct per
 * prompt, FALSE for one struct for all (a random seed is then drawn once, as in Python).
 *
 * Returns list(columns, stats), a fastpar_failure, or NULL when interrupted. */
static SEXP fastpar_r_generate(SEXP ctx_ptr, SEXP prompts, SEXP opts, SEXP per_prompt) {
    fastpar_context * ctx = (fastpar_context *) handle(ctx_ptr, context_tag(), "context");
    const R_xlen_t n_prompts = Rf_xlength(prompts);
    if (n_prompts > INT32_MAX) {
        Rf_error("too many prompts");
    }
    const int n_params = Rf_asLogical(per_prompt) == TRUE ? (int) n_prompts : 1;

    /* R-owned memory (R_alloc) for the arrays: released by R even on an error. */
    fastpar_prompt * in = r_prompts(prompts);

    SEXP given[N_FIELDS(generate_fields)]; /* each option's values, R_NilValue if not given */
    for (size_t k = 0; k < N_FIELDS(generate_fields); ++k) {
        given[k] = option(opts, generate_fields[k].name);
    }
    fastpar_generate_params * gp =
        (fastpar_generate_params *) R_alloc((size_t) n_params + 1, sizeof(fastpar_generate_params));
    for (int i = 0; i < n_params; ++i) {
        gp[i] = fastpar_generate_default_params();
        for (size_t k = 0; k < N_FIELDS(generate_fields); ++k) {
            if (given[k] != R_NilValue) {
                set_field(&gp[i], &generate_fields[k], given[k], i);
            }
        }
    }

    /* The results' owner exists before the results: if copying them into R fails, R's
     * garbage collector still frees them; on success they are freed explicitly below. */
    SEXP count = PROTECT(Rf_ScalarInteger(0));
    SEXP held = PROTECT(owner(R_NilValue, count, results_finalizer));
    fastpar_completion * results = NULL;
    int32_t n_results = 0;
    g_next_poll = 0.0;
    const fastpar_status st = fastpar_generate(ctx, in, (int32_t) n_prompts, gp, n_params, &results, &n_results);
    if (st == FASTPAR_ERR_INTERRUPTED) {
        UNPROTECT(2);
        return R_NilValue; /* nothing was allocated; the context is clean */
    }
    if (st != FASTPAR_OK) {
        UNPROTECT(2);
        return failure(st); /* nothing was allocated */
    }
    INTEGER(count)[0] = n_results;
    R_SetExternalPtrAddr(held, results);

    bool any_logprobs = false, any_top = false, any_split = false, any_tools = false;
    for (int32_t k = 0; k < n_results; ++k) {
        any_logprobs = any_logprobs || results[k].logprobs != NULL;
        any_top = any_top || results[k].n_top_logprobs > 0;
    }
    for (R_xlen_t i = 0; i < n_params; ++i) {
        any_split = any_split || (gp[i].reasoning != NULL && strcmp(gp[i].reasoning, "split") == 0);
        any_tools = any_tools || gp[i].tools != NULL;
    }
    const char * names[] = {"prompt_index", "sample_index", "text", "finish_reason", "error", "n_prompt_tokens",
                            "n_prompt_tokens_shared", "n_prompt_tokens_cached", "n_gen_tokens", "token_ids",
                            "logprobs", "top_logprobs", "reasoning", "tool_calls", ""};
    SEXP cols = PROTECT(Rf_mkNamed(VECSXP, names));
    SEXP prompt_index = Rf_allocVector(INTSXP, n_results);
    SET_VECTOR_ELT(cols, 0, prompt_index);
    SEXP sample_index = Rf_allocVector(INTSXP, n_results);
    SET_VECTOR_ELT(cols, 1, sample_index);
    SEXP text = Rf_allocVector(STRSXP, n_results);
    SET_VECTOR_ELT(cols, 2, text);
    SEXP finish = Rf_allocVector(STRSXP, n_results);
    SET_VECTOR_ELT(cols, 3, finish);
    SEXP error = Rf_allocVector(STRSXP, n_results);
    SET_VECTOR_ELT(cols, 4, error);
    SEXP n_prompt = Rf_allocVector(INTSXP, n_results);
    SET_VECTOR_ELT(cols, 5, n_prompt);
    SEXP n_shared = Rf_allocVector(INTSXP, n_results);
    SET_VECTOR_ELT(cols, 6, n_shared);
    SEXP n_cached = Rf_allocVector(INTSXP, n_results);
    SET_VECTOR_ELT(cols, 7, n_cached);
    SEXP n_gen = Rf_allocVector(INTSXP, n_results);
    SET_VECTOR_ELT(cols, 8, n_gen);
    SEXP token_ids = Rf_allocVector(VECSXP, n_results);
    SET_VECTOR_ELT(cols, 9, token_ids);
    SEXP lp = any_logprobs ? Rf_allocVector(VECSXP, n_results) : R_NilValue;
    SET_VECTOR_ELT(cols, 10, lp);
    SEXP top = any_top ? Rf_allocVector(VECSXP, n_results) : R_NilValue;
    SET_VECTOR_ELT(cols, 11, top);
    SEXP reasoning = any_split ? Rf_allocVector(STRSXP, n_results) : R_NilValue;
    SET_VECTOR_ELT(cols, 12, reasoning);
    SEXP tool_calls = any_tools ? Rf_allocVector(VECSXP, n_results) : R_NilValue;
    SET_VECTOR_ELT(cols, 13, tool_calls);

    /* Prompt i contributes its n samples in turn (fastpar_generate's order). */
    int32_t k = 0;
    for (R_xlen_t i = 0; i < n_prompts && k < n_results; ++i) {
        const int n_i = gp[n_params == 1 ? 0 : i].n;
        for (int j = 0; j < n_i && k < n_results; ++j, ++k) {
            const fastpar_completion * c = &results[k];
            INTEGER(prompt_index)[k] = (int) i + 1;
            INTEGER(sample_index)[k] = j + 1;
            SET_STRING_ELT(text, k, Rf_mkCharLenCE(c->text, (int) c->text_len, CE_UTF8));
            SET_STRING_ELT(finish, k, Rf_mkChar(fastpar_finish_reason_name(c->finish_reason)));
            SET_STRING_ELT(error, k, c->error != NULL ? Rf_mkCharCE(c->error, CE_UTF8) : NA_STRING);
            INTEGER(n_prompt)[k] = c->n_prompt_tokens;
            INTEGER(n_shared)[k] = c->n_prompt_tokens_shared;
            INTEGER(n_cached)[k] = c->n_prompt_tokens_cached;
            INTEGER(n_gen)[k] = c->n_gen_tokens;
            SEXP ids = Rf_allocVector(INTSXP, c->n_gen_tokens);
            SET_VECTOR_ELT(token_ids, k, ids);
            if (c->n_gen_tokens > 0) {
                memcpy(INTEGER(ids), c->token_ids, sizeof(int32_t) * (size_t) c->n_gen_tokens);
            }
            if (any_logprobs) {
                SEXP v = Rf_allocVector(REALSXP, c->logprobs != NULL ? c->n_gen_tokens : 0);
                SET_VECTOR_ELT(lp, k, v);
                for (int32_t t = 0; c->logprobs != NULL && t < c->n_gen_tokens; ++t) {
                    REAL(v)[t] = c->logprobs[t];
                }
            }
            if (any_top) {
                SET_VECTOR_ELT(top, k, top_logprobs_entry(c));
            }
            if (any_split) {
                SET_STRING_ELT(reasoning, k, Rf_mkCharCE(c->reasoning != NULL ? c->reasoning : "", CE_UTF8));
            }
            if (any_tools) {
                SET_VECTOR_ELT(tool_calls, k, tool_calls_frame(c));
            }
        }
    }
    results_finalizer(held); /* freed now, not at the next garbage collection */

    /* A call without prompts runs nothing: the context's last stats are another call's. */
    fastpar_stats s;
    SEXP stats = n_prompts > 0 && fastpar_context_last_stats(ctx, &s) == FASTPAR_OK ? stats_list(&s) : R_NilValue;
    PROTECT(stats);
    const char * out_names[] = {"columns", "stats", ""};
    SEXP out = PROTECT(Rf_mkNamed(VECSXP, out_names));
    SET_VECTOR_ELT(out, 0, cols);
    SET_VECTOR_ELT(out, 1, stats);
    UNPROTECT(5);
    return out;
}

static const R_CallMethodDef call_methods[] = {
    {"fastpar_r_info", (DL_FUNC) &fastpar_r_info, 0},
    {"fastpar_r_default_params", (DL_FUNC) &fastpar_r_default_params, 0},
    {"fastpar_r_model_load", (DL_FUNC) &fastpar_r_model_load, 2},
    {"fastpar_r_context_new", (DL_FUNC) &fastpar_r_context_new, 2},
    {"fastpar_r_free", (DL_FUNC) &fastpar_r_free, 1},
    {"fastpar_r_is_live", (DL_FUNC) &fastpar_r_is_live, 1},
    {"fastpar_r_last_stats", (DL_FUNC) &fastpar_r_last_stats, 1},
    {"fastpar_r_generate", (DL_FUNC) &fastpar_r_generate, 4},
    {"fastpar_r_embed", (DL_FUNC) &fastpar_r_embed, 4},
    {NULL, NULL, 0},
};

void R_init_fastpar(DllInfo * dll) {
    R_registerRoutines(dll, NULL, call_methods, NULL, NULL);
    R_useDynamicSymbols(dll, FALSE);
    R_forceSymbols(dll, TRUE);
}
