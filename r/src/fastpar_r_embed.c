/* .Call glue for embeddings and reranking over fastpar.h (the rules of fastpar_r.c hold here). */
#include <stdbool.h>

#include <R.h>
#include <Rinternals.h>

#include "fastpar.h"
#include "fastpar_r.h"

/* texts: a character vector (UTF-8); normalize: TRUE/FALSE; query: NULL, or a string whose
 * pairs with the texts a reranker scores (fastpar_rerank). Returns list(rows = a numeric
 * matrix, one row per text (NA where a text failed), errors = a character vector (NA where
 * it did not), n_prompt_tokens, stats), NULL when interrupted, or a fastpar_failure. */
SEXP fastpar_r_embed(SEXP ctx_ptr, SEXP texts, SEXP normalize, SEXP query) {
    fastpar_context * ctx = (fastpar_context *) handle(ctx_ptr, context_tag(), "context");
    const R_xlen_t n = Rf_xlength(texts);
    const char ** in = (const char **) R_alloc((size_t) n + 1, sizeof(char *));
    for (R_xlen_t i = 0; i < n; ++i) {
        in[i] = Rf_translateCharUTF8(STRING_ELT(texts, i));
    }
    /* The results' owner exists before the results (as in fastpar_r_generate). */
    SEXP count = PROTECT(Rf_ScalarInteger(0));
    SEXP held = PROTECT(owner(R_NilValue, count, results_finalizer));
    fastpar_completion * results = NULL;
    g_next_poll = 0.0;
    const fastpar_status st =
        query == R_NilValue
            ? fastpar_embed(ctx, in, (int32_t) n, LOGICAL(normalize)[0] == TRUE, &results)
            : fastpar_rerank(ctx, Rf_translateCharUTF8(STRING_ELT(query, 0)), in, (int32_t) n, &results);
    if (st == FASTPAR_ERR_INTERRUPTED) {
        UNPROTECT(2);
        return R_NilValue;
    }
    if (st != FASTPAR_OK) {
        UNPROTECT(2);
        return failure(st);
    }
    INTEGER(count)[0] = (int) n;
    R_SetExternalPtrAddr(held, results);
    int dim = 0;
    for (R_xlen_t i = 0; i < n; ++i) {
        dim = results[i].n_embedding > dim ? results[i].n_embedding : dim;
    }
    SEXP rows = PROTECT(Rf_allocMatrix(REALSXP, (int) n, dim));
    SEXP errors = PROTECT(Rf_allocVector(STRSXP, n));
    SEXP n_tokens = PROTECT(Rf_allocVector(INTSXP, n));
    for (R_xlen_t i = 0; i < n; ++i) {
        const fastpar_completion * c = &results[i];
        const bool ok = c->finish_reason != FASTPAR_FINISH_ERROR && c->n_embedding == dim;
        for (int k = 0; k < dim; ++k) {  /* column-major: element (i, k) */
            REAL(rows)[i + (R_xlen_t) k * n] = ok ? (double) c->embedding[k] : NA_REAL;
        }
        SET_STRING_ELT(errors, i, ok ? NA_STRING : Rf_mkCharCE(c->error != NULL ? c->error : "no vector", CE_UTF8));
        INTEGER(n_tokens)[i] = c->n_prompt_tokens;
    }
    results_finalizer(held);
    fastpar_stats s;
    SEXP stats = n > 0 && fastpar_context_last_stats(ctx, &s) == FASTPAR_OK ? stats_list(&s) : R_NilValue;
    PROTECT(stats);
    const char * names[] = {"rows", "errors", "n_prompt_tokens", "stats", ""};
    SEXP out = PROTECT(Rf_mkNamed(VECSXP, names));
    SET_VECTOR_ELT(out, 0, rows);
    SET_VECTOR_ELT(out, 1, errors);
    SET_VECTOR_ELT(out, 2, n_tokens);
    SET_VECTOR_ELT(out, 3, stats);
    UNPROTECT(7);
    return out;
}
