/*
 * R glue over fastpar.h: plain C called through .Call. Build it with R CMD SHLIB against
 * the installed Python package's header and library (README.md in this folder).
 *
 * Rules kept here:
 *  - Models and contexts are external pointers with finalizers: R's garbage collector
 *    frees them, and fastpar_r_free() frees them at once.
 *  - An R error (Rf_error, or an allocation that fails) longjmps out of C. So the external
 *    pointer that will own a fastpar resource is allocated BEFORE the resource, and takes
 *    it at once; a failed fastpar call allocates nothing, and its message is copied into
 *    our own buffer before Rf_error. Nothing fastpar made is ever left unowned.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <R.h>
#include <Rinternals.h>

#include "fastpar.h"

static char g_message[1024];

/* Copies fastpar's message for `status` so that it outlives every fastpar resource. */
static const char * failure(const char * what, fastpar_status status) {
    snprintf(g_message, sizeof g_message, "%s failed (status %d): %s", what, (int) status, fastpar_last_error());
    return g_message;
}

static void model_finalizer(SEXP ptr) {
    fastpar_model_free((fastpar_model *) R_ExternalPtrAddr(ptr));
    R_ClearExternalPtr(ptr);
}

static void context_finalizer(SEXP ptr) {
    fastpar_context_free((fastpar_context *) R_ExternalPtrAddr(ptr));
    R_ClearExternalPtr(ptr);
}

static void results_finalizer(SEXP ptr) {
    SEXP n = R_ExternalPtrProtected(ptr);
    fastpar_results_free((fastpar_completion *) R_ExternalPtrAddr(ptr), Rf_asInteger(n));
    R_ClearExternalPtr(ptr);
}

static void * handle(SEXP ptr, SEXP tag, const char * what) {
    if (TYPEOF(ptr) != EXTPTRSXP || R_ExternalPtrTag(ptr) != tag) {
        Rf_error("expected a fastpar %s", what);
    }
    void * p = R_ExternalPtrAddr(ptr);
    if (p == NULL) {
        Rf_error("this fastpar %s has been freed", what);
    }
    return p;
}

static SEXP model_tag(void) { return Rf_install("fastpar_model"); }
static SEXP context_tag(void) { return Rf_install("fastpar_context"); }

/* An empty owner for a resource still to be made; its finalizer frees whatever it holds. */
static SEXP owner(SEXP tag, SEXP keep, R_CFinalizer_t finalizer) {
    SEXP ptr = PROTECT(R_MakeExternalPtr(NULL, tag, keep));
    R_RegisterCFinalizerEx(ptr, finalizer, TRUE);
    UNPROTECT(1);
    return ptr;
}

/* Optional numeric argument: NULL keeps fastpar's default. */
static int has(SEXP x) { return !Rf_isNull(x); }

SEXP fastpar_r_version(void) { return Rf_mkString(fastpar_version()); }

SEXP fastpar_r_model_load(SEXP path, SEXP n_gpu_layers) {
    if (!Rf_isString(path) || Rf_length(path) != 1 || STRING_ELT(path, 0) == NA_STRING) {
        Rf_error("path must be one string");
    }
    fastpar_model_params mp = fastpar_model_default_params();
    if (has(n_gpu_layers)) {
        mp.n_gpu_layers = Rf_asInteger(n_gpu_layers);
    }
    const char * file = Rf_translateCharUTF8(STRING_ELT(path, 0));
    SEXP ptr = PROTECT(owner(model_tag(), R_NilValue, model_finalizer));
    fastpar_model * model = NULL;
    const fastpar_status st = fastpar_model_load(file, mp, &model);
    if (st != FASTPAR_OK) {
        Rf_error("%s", failure("fastpar_model_load", st)); /* nothing was allocated */
    }
    R_SetExternalPtrAddr(ptr, model);
    UNPROTECT(1);
    return ptr;
}

SEXP fastpar_r_context_new(SEXP model_ptr, SEXP n_parallel, SEXP n_ctx_per_seq, SEXP n_threads) {
    fastpar_model * model = (fastpar_model *) handle(model_ptr, model_tag(), "model");
    fastpar_context_params cp = fastpar_context_default_params();
    if (has(n_parallel)) {
        cp.n_parallel = Rf_asInteger(n_parallel);
    }
    if (has(n_ctx_per_seq)) {
        cp.n_ctx_per_seq = Rf_asInteger(n_ctx_per_seq);
    }
    if (has(n_threads)) {
        cp.n_threads = Rf_asInteger(n_threads);
    }
    /* The context keeps its model alive on the C side; the R handle keeps the model's too. */
    SEXP ptr = PROTECT(owner(context_tag(), model_ptr, context_finalizer));
    fastpar_context * ctx = NULL;
    const fastpar_status st = fastpar_context_new(model, cp, &ctx);
    if (st != FASTPAR_OK) {
        Rf_error("%s", failure("fastpar_context_new", st));
    }
    R_SetExternalPtrAddr(ptr, ctx);
    UNPROTECT(1);
    return ptr;
}

SEXP fastpar_r_free(SEXP ptr) {
    if (TYPEOF(ptr) == EXTPTRSXP) {
        if (R_ExternalPtrTag(ptr) == model_tag()) {
            model_finalizer(ptr);
        } else if (R_ExternalPtrTag(ptr) == context_tag()) {
            context_finalizer(ptr);
        }
    }
    return R_NilValue;
}

/* generate_parallel(ctx, prompts, max_tokens, temperature, top_k, top_p, min_p,
 * repeat_penalty, seed, stop, ignore_eos): a list with one entry per prompt. */
SEXP fastpar_r_generate(SEXP ctx_ptr, SEXP prompts, SEXP max_tokens, SEXP temperature, SEXP top_k, SEXP top_p,
                        SEXP min_p, SEXP repeat_penalty, SEXP seed, SEXP stop, SEXP ignore_eos) {
    fastpar_context * ctx = (fastpar_context *) handle(ctx_ptr, context_tag(), "context");
    if (!Rf_isString(prompts)) {
        Rf_error("prompts must be a character vector");
    }
    if (has(stop) && !Rf_isString(stop)) {
        Rf_error("stop must be a character vector or NULL");
    }
    const int n = Rf_length(prompts);
    const int n_stop = has(stop) ? Rf_length(stop) : 0;
    for (int i = 0; i < n; ++i) {
        if (STRING_ELT(prompts, i) == NA_STRING) {
            Rf_error("prompt %d is NA", i + 1);
        }
    }
    fastpar_generate_params gp = fastpar_generate_default_params();
    if (has(max_tokens)) gp.max_tokens = Rf_asInteger(max_tokens);
    if (has(temperature)) gp.temperature = (float) Rf_asReal(temperature);
    if (has(top_k)) gp.top_k = Rf_asInteger(top_k);
    if (has(top_p)) gp.top_p = (float) Rf_asReal(top_p);
    if (has(min_p)) gp.min_p = (float) Rf_asReal(min_p);
    if (has(repeat_penalty)) gp.repeat_penalty = (float) Rf_asReal(repeat_penalty);
    if (has(seed)) gp.seed = (int64_t) Rf_asReal(seed);
    if (has(ignore_eos)) gp.ignore_eos = Rf_asLogical(ignore_eos) == TRUE;

    /* R-owned memory (R_alloc) for the string arrays: released by R even on an error. */
    const char ** texts = (const char **) R_alloc((size_t) n + 1, sizeof(char *));
    for (int i = 0; i < n; ++i) {
        texts[i] = Rf_translateCharUTF8(STRING_ELT(prompts, i));
    }
    const char ** stops = (const char **) R_alloc((size_t) n_stop + 1, sizeof(char *));
    for (int i = 0; i < n_stop; ++i) {
        stops[i] = Rf_translateCharUTF8(STRING_ELT(stop, i));
    }
    gp.stop = n_stop > 0 ? stops : NULL;
    gp.n_stop = n_stop;

    /* The results' owner exists before the results: if copying them into R fails, R's
     * garbage collector still frees them; on success they are freed explicitly below. */
    SEXP held = PROTECT(owner(R_NilValue, PROTECT(Rf_ScalarInteger(n)), results_finalizer));
    fastpar_completion * results = NULL;
    const fastpar_status st = fastpar_generate_parallel(ctx, texts, n, gp, &results);
    if (st != FASTPAR_OK) {
        Rf_error("%s", failure("fastpar_generate_parallel", st)); /* nothing was allocated */
    }
    R_SetExternalPtrAddr(held, results);

    const char * names[] = {"text", "token_ids", "finish_reason", "error", "n_prompt_tokens", "n_gen_tokens", ""};
    SEXP out = PROTECT(Rf_allocVector(VECSXP, n));
    for (int i = 0; i < n; ++i) {
        const fastpar_completion * c = &results[i];
        SEXP item = PROTECT(Rf_mkNamed(VECSXP, names));
        SET_VECTOR_ELT(item, 0, Rf_ScalarString(Rf_mkCharLenCE(c->text, (int) c->text_len, CE_UTF8)));
        SEXP ids = PROTECT(Rf_allocVector(INTSXP, c->n_gen_tokens));
        for (int k = 0; k < c->n_gen_tokens; ++k) {
            INTEGER(ids)[k] = c->token_ids[k];
        }
        SET_VECTOR_ELT(item, 1, ids);
        SET_VECTOR_ELT(item, 2, Rf_mkString(fastpar_finish_reason_name(c->finish_reason)));
        SET_VECTOR_ELT(item, 3, c->error != NULL ? Rf_ScalarString(Rf_mkCharCE(c->error, CE_UTF8))
                                                 : Rf_ScalarString(NA_STRING));
        SET_VECTOR_ELT(item, 4, Rf_ScalarInteger(c->n_prompt_tokens + c->n_prompt_tokens_shared));
        SET_VECTOR_ELT(item, 5, Rf_ScalarInteger(c->n_gen_tokens));
        SET_VECTOR_ELT(out, i, item);
        UNPROTECT(2);
    }
    results_finalizer(held); /* freed now, not at the next garbage collection */
    UNPROTECT(3);
    return out;
}

SEXP fastpar_r_last_stats(SEXP ctx_ptr) {
    fastpar_context * ctx = (fastpar_context *) handle(ctx_ptr, context_tag(), "context");
    fastpar_stats s;
    const fastpar_status st = fastpar_context_last_stats(ctx, &s);
    if (st != FASTPAR_OK) {
        Rf_error("%s", failure("fastpar_context_last_stats", st));
    }
    const char * names[] = {"n_prompts", "n_failed", "n_prompt_tokens", "n_prompt_tokens_shared", "n_gen_tokens",
                            "t_wall_ms", "gen_tokens_per_s", "total_tokens_per_s", ""};
    SEXP out = PROTECT(Rf_mkNamed(VECSXP, names));
    SET_VECTOR_ELT(out, 0, Rf_ScalarReal((double) s.n_prompts));
    SET_VECTOR_ELT(out, 1, Rf_ScalarReal((double) s.n_failed));
    SET_VECTOR_ELT(out, 2, Rf_ScalarReal((double) s.n_prompt_tokens));
    SET_VECTOR_ELT(out, 3, Rf_ScalarReal((double) s.n_prompt_tokens_shared));
    SET_VECTOR_ELT(out, 4, Rf_ScalarReal((double) s.n_gen_tokens));
    SET_VECTOR_ELT(out, 5, Rf_ScalarReal(s.t_wall_ms));
    SET_VECTOR_ELT(out, 6, Rf_ScalarReal(s.gen_tokens_per_s));
    SET_VECTOR_ELT(out, 7, Rf_ScalarReal(s.total_tokens_per_s));
    UNPROTECT(1);
    return out;
}
