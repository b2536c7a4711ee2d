/* Exercises fastpar_rerank from plain C on a reranker: 20 documents, one of invalid UTF-8 and
 * one too long for a batch among them, and the refusals. Prints "capi-rerank: score I V" for
 * every scored document and "capi-rerank: error I MESSAGE" for each failed one, which the
 * pytest driver compares with Python's fastpar.rerank; exits non-zero on failure. */
#include <stdio.h>
#include <string.h>

#include "fastpar.h"

#define CHECK_PREFIX "capi-rerank"
#include "check.h"

#define N_DOCS 20

int main(int argc, char ** argv) {
    CHECK(argc == 2, "usage: capi_rerank RERANKER.gguf");
    fastpar_model * model = NULL;
    CHECK(fastpar_model_load(argv[1], test_model_params(), &model) == FASTPAR_OK, "load");
    fastpar_context_params cp = fastpar_context_default_params();
    cp.n_parallel = 4;
    cp.embeddings = true;  /* pooling NULL: the reranker's own, rank */
    fastpar_context * ctx = NULL;
    CHECK(fastpar_context_new(model, cp, &ctx) == FASTPAR_OK, "reranker context");

    static char docs[N_DOCS][64];
    static char long_doc[4001];
    const char * ptrs[N_DOCS];
    for (int i = 0; i < N_DOCS; ++i) {
        snprintf(docs[i], sizeof docs[i], "Document %d says pandas eat bamboo %d times a day.", i, i % 7);
        ptrs[i] = docs[i];
    }
    for (int i = 0; i < 4000; ++i) {
        long_doc[i] = i % 5 == 4 ? ' ' : 'w';
    }
    ptrs[5] = "bad \xff\xfe bytes";
    ptrs[13] = long_doc;
    const char * query = "What do pandas eat?";

    fastpar_completion * out = NULL;
    CHECK(fastpar_rerank(ctx, query, ptrs, N_DOCS, &out) == FASTPAR_OK, "rerank");
    for (int i = 0; i < N_DOCS; ++i) {
        const fastpar_completion * r = &out[i];
        if (r->finish_reason == FASTPAR_FINISH_ERROR) {
            CHECK(r->embedding == NULL && r->error != NULL, "a failed pair has no score");
            printf("capi-rerank: error %d %s\n", i, r->error);
            continue;
        }
        CHECK(r->finish_reason == FASTPAR_FINISH_STOP && r->embedding != NULL && r->n_embedding == 1, "doc %d", i);
        CHECK(r->n_prompt_tokens > 0, "doc %d's tokens", i);
        printf("capi-rerank: score %d %.7f\n", i, r->embedding[0]);
    }
    fastpar_results_free(out, N_DOCS);

    /* Refusals: an invalid query, NULLs, a context that does not rerank; none crashes. */
    CHECK(fastpar_rerank(ctx, "bad \xff query", ptrs, 1, &out) == FASTPAR_ERR_INVALID_ARGUMENT, "invalid query");
    CHECK(strstr(fastpar_last_error(), "not valid UTF-8") != NULL, "its message");
    CHECK(fastpar_rerank(ctx, NULL, ptrs, 1, &out) == FASTPAR_ERR_INVALID_ARGUMENT, "NULL query");
    CHECK(fastpar_rerank(ctx, query, NULL, 1, &out) == FASTPAR_ERR_INVALID_ARGUMENT, "NULL documents");
    CHECK(fastpar_rerank(ctx, query, ptrs, -1, &out) == FASTPAR_ERR_INVALID_ARGUMENT, "negative count");
    out = (fastpar_completion *) 1;
    CHECK(fastpar_rerank(ctx, query, ptrs, 0, &out) == FASTPAR_OK && out == NULL, "no documents");
    cp.pooling = "mean";
    fastpar_context * embedder = NULL;
    CHECK(fastpar_context_new(model, cp, &embedder) == FASTPAR_OK, "embeddings context");
    CHECK(fastpar_rerank(embedder, query, ptrs, 1, &out) == FASTPAR_ERR_INVALID_ARGUMENT, "a mean context");
    CHECK(strstr(fastpar_last_error(), "does not rerank") != NULL, "its message");
    fastpar_context_free(embedder);
    fastpar_context_free(ctx);
    fastpar_model_free(model);
    printf("capi-rerank: ok\n");
    return 0;
}
