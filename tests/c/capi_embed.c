/* Exercises fastpar_embed from plain C: 100 texts, one empty, one of invalid UTF-8 and one too
 * long for a batch among them, and the refusals. Prints "capi-embed: row I DIM V0 V1 V2" for
 * every 10th text and "capi-embed: error I MESSAGE" for each failed one, which the pytest
 * driver compares with Python; exits non-zero on failure. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fastpar.h"

#define CHECK_PREFIX "capi-embed"
#include "check.h"

#define N_TEXTS 100

int main(int argc, char ** argv) {
    CHECK(argc == 2, "usage: capi_embed MODEL.gguf");
    fastpar_model * model = NULL;
    CHECK(fastpar_model_load(argv[1], test_model_params(), &model) == FASTPAR_OK, "load");

    fastpar_context_params cp = fastpar_context_default_params();
    CHECK(!cp.embeddings && cp.pooling == NULL, "defaults: a generation context, the model's pooling");
    cp.n_parallel = 8;
    cp.n_batch = 256;
    cp.embeddings = true;
    cp.pooling = "mean";
    fastpar_context * ctx = NULL;
    CHECK(fastpar_context_new(model, cp, &ctx) == FASTPAR_OK, "embeddings context");

    static char texts[N_TEXTS][64];
    static char long_text[4001];
    const char * ptrs[N_TEXTS];
    for (int i = 0; i < N_TEXTS; ++i) {
        snprintf(texts[i], sizeof texts[i], "Sentence number %d is about the sea.", i);
        ptrs[i] = texts[i];
    }
    for (int i = 0; i < 4000; ++i) {
        long_text[i] = i % 5 == 4 ? ' ' : 'w';
    }
    ptrs[7] = "";
    ptrs[42] = "bad \xff\xfe bytes";
    ptrs[77] = long_text;

    fastpar_completion * out = NULL;
    CHECK(fastpar_embed(ctx, ptrs, N_TEXTS, true, &out) == FASTPAR_OK, "embed");
    for (int i = 0; i < N_TEXTS; ++i) {
        const fastpar_completion * r = &out[i];
        if (r->finish_reason == FASTPAR_FINISH_ERROR) {
            CHECK(r->embedding == NULL && r->n_embedding == 0 && r->error != NULL, "a failed text has no vector");
            printf("capi-embed: error %d %s\n", i, r->error);
            continue;
        }
        CHECK(r->finish_reason == FASTPAR_FINISH_STOP && r->embedding != NULL && r->n_embedding > 0, "text %d", i);
        double norm = 0;
        for (int32_t k = 0; k < r->n_embedding; ++k) {
            norm += (double) r->embedding[k] * r->embedding[k];
        }
        CHECK(fabs(norm - 1.0) < 1e-4, "row %d has length %f", i, sqrt(norm));
        if (i % 10 == 0) {
            printf("capi-embed: row %d %d %.7f %.7f %.7f\n", i, r->n_embedding, r->embedding[0], r->embedding[1],
                   r->embedding[2]);
        }
    }
    fastpar_results_free(out, N_TEXTS);

    /* Refusals: a generation context embeds nothing; NULLs are errors, never crashes. */
    fastpar_context * gen = NULL;
    CHECK(fastpar_context_new(model, fastpar_context_default_params(), &gen) == FASTPAR_OK, "generation context");
    CHECK(fastpar_embed(gen, ptrs, 1, true, &out) == FASTPAR_ERR_INVALID_ARGUMENT, "embed on a generation context");
    CHECK(strstr(fastpar_last_error(), "made for generation") != NULL, "its message");
    CHECK(fastpar_embed(ctx, NULL, 1, true, &out) == FASTPAR_ERR_INVALID_ARGUMENT, "NULL texts");
    CHECK(fastpar_embed(ctx, ptrs, 1, true, NULL) == FASTPAR_ERR_INVALID_ARGUMENT, "NULL results");
    CHECK(fastpar_embed(ctx, ptrs, 0, true, &out) == FASTPAR_OK && out == NULL, "no texts");
    fastpar_generate_params gp = fastpar_generate_default_params();
    CHECK(fastpar_generate_parallel(ctx, ptrs, 1, gp, &out) == FASTPAR_ERR_INVALID_ARGUMENT, "generate on embeddings");
    cp.pooling = "max";
    fastpar_context * bad = NULL;
    CHECK(fastpar_context_new(model, cp, &bad) == FASTPAR_ERR_INVALID_ARGUMENT && bad == NULL, "unknown pooling");
    fastpar_context_free(gen);
    fastpar_context_free(ctx);
    fastpar_model_free(model);
    printf("capi-embed: ok\n");
    return 0;
}
