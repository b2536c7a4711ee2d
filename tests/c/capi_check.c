/* Exercises fastpar.h from plain C: per-prompt status, NULL arguments, and memory over
 * 20 calls. Prints "capi: ..." lines the pytest driver checks; exits non-zero on failure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fastpar.h"

#define CHECK_PREFIX "capi"
#include "check.h"

/* Defined only when AddressSanitizer's runtime is in the process (scripts/sanitize.sh
   preloads it). ASan keeps freed memory in quarantine, so resident memory grows under it
   whether or not anything leaks: the flat-memory check below means nothing there. */
extern void __asan_init(void) __attribute__((weak));

static long rss_kib(void) {
    FILE * f = fopen("/proc/self/status", "r");
    char line[256];
    long kib = -1;
    if (!f) return -1;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "VmRSS:", 6) == 0) {
            kib = strtol(line + 6, NULL, 10);
        }
    }
    fclose(f);
    return kib;
}

int main(int argc, char ** argv) {
    CHECK(argc == 2, "usage: capi_check MODEL.gguf");
    printf("capi: version %s backend %s\n", fastpar_version(), fastpar_backend());
    CHECK(strcmp(fastpar_finish_reason_name(FASTPAR_FINISH_LENGTH), "length") == 0, "finish reason names");
    CHECK(strcmp(fastpar_finish_reason_name((fastpar_finish_reason)42), "unknown") == 0, "unknown finish reason");

    fastpar_model * model = NULL;
    fastpar_context * ctx = NULL;
    fastpar_completion * results = NULL;
    fastpar_generate_params gp = fastpar_generate_default_params();
    fastpar_context_params cp = fastpar_context_default_params();
    fastpar_stats stats;

    /* NULL and bad arguments give error codes and messages, never a crash. */
    CHECK(fastpar_model_load(NULL, fastpar_model_default_params(), &model) == FASTPAR_ERR_INVALID_ARGUMENT, "NULL path");
    CHECK(strlen(fastpar_last_error()) > 0, "message for NULL path");
    CHECK(fastpar_model_load("/nonexistent/model.gguf", fastpar_model_default_params(), &model) == FASTPAR_ERR_NOT_FOUND,
          "missing file");
    CHECK(fastpar_model_load(argv[1], fastpar_model_default_params(), NULL) == FASTPAR_ERR_INVALID_ARGUMENT, "NULL out");
    CHECK(fastpar_context_new(NULL, cp, &ctx) == FASTPAR_ERR_INVALID_ARGUMENT, "NULL model");
    CHECK(fastpar_generate_parallel(NULL, NULL, 0, gp, &results) == FASTPAR_ERR_INVALID_ARGUMENT, "NULL ctx");
    CHECK(fastpar_context_last_stats(NULL, &stats) == FASTPAR_ERR_INVALID_ARGUMENT, "NULL ctx stats");
    fastpar_model_free(NULL);
    fastpar_context_free(NULL);
    fastpar_results_free(NULL, 3);

    fastpar_model_params mp = test_model_params();
    CHECK(fastpar_model_load(argv[1], mp, &model) == FASTPAR_OK, "load");
    cp.n_parallel = 4;
    cp.n_ctx_per_seq = 128;
    fastpar_context_params bad_cp = cp;
    bad_cp.n_parallel = 0;
    CHECK(fastpar_context_new(model, bad_cp, &ctx) == FASTPAR_ERR_INVALID_ARGUMENT, "n_parallel 0");
    CHECK(strstr(fastpar_last_error(), "n_parallel") != NULL, "message names n_parallel");
    CHECK(fastpar_context_new(model, cp, &ctx) == FASTPAR_OK, "context");
    fastpar_model_free(model); /* the context keeps the model alive */

    char long_prompt[4000] = "";
    for (int i = 0; i < 300; ++i) strcat(long_prompt, "word ");
    const char * prompts[4] = {"The capital of France is", long_prompt, "Water boils at", "The quick brown fox"};
    gp.temperature = 0.0f;
    gp.max_tokens = 16;

    CHECK(fastpar_generate_parallel(ctx, NULL, 4, gp, &results) == FASTPAR_ERR_INVALID_ARGUMENT, "NULL prompts");
    CHECK(fastpar_generate_parallel(ctx, prompts, -1, gp, &results) == FASTPAR_ERR_INVALID_ARGUMENT, "n < 0");
    const char * with_null[2] = {"ok", NULL};
    CHECK(fastpar_generate_parallel(ctx, with_null, 2, gp, &results) == FASTPAR_ERR_INVALID_ARGUMENT, "NULL prompt");
    fastpar_generate_params bad_gp = gp;
    bad_gp.max_tokens = -1;
    CHECK(fastpar_generate_parallel(ctx, prompts, 4, bad_gp, &results) == FASTPAR_ERR_INVALID_ARGUMENT, "max_tokens");
    CHECK(fastpar_generate_parallel(ctx, prompts, 0, gp, &results) == FASTPAR_OK && results == NULL, "0 prompts");

    CHECK(fastpar_generate_parallel(ctx, prompts, 4, gp, &results) == FASTPAR_OK, "generate");
    for (int i = 0; i < 4; ++i) {
        const fastpar_completion * c = &results[i];
        printf("capi: prompt %d finish %d prompt_tokens %d gen_tokens %d tokens", i, (int)c->finish_reason,
               c->n_prompt_tokens, c->n_gen_tokens);
        for (int t = 0; t < c->n_gen_tokens; ++t) printf(" %d", c->token_ids[t]);
        printf(" | error %s\n", c->error ? c->error : "-");
        if (i == 1) {
            CHECK(c->finish_reason == FASTPAR_FINISH_ERROR && c->error != NULL, "long prompt fails alone");
        } else {
            CHECK(c->finish_reason != FASTPAR_FINISH_ERROR && c->error == NULL, "prompt %d ok", i);
            CHECK(c->n_gen_tokens > 0 && strlen(c->text) == c->text_len, "prompt %d has text", i);
        }
    }
    CHECK(fastpar_context_last_stats(ctx, &stats) == FASTPAR_OK, "stats");
    CHECK(stats.n_prompts == 4 && stats.n_failed == 1, "stats counts");
    CHECK(stats.n_gen_tokens == results[0].n_gen_tokens + results[2].n_gen_tokens + results[3].n_gen_tokens,
          "stats sum");
    fastpar_results_free(results, 4);

    /* Memory stays flat over repeated calls. */
    long rss_after_5 = 0;
    for (int k = 0; k < 20; ++k) {
        CHECK(fastpar_generate_parallel(ctx, prompts, 4, gp, &results) == FASTPAR_OK, "loop %d", k);
        fastpar_results_free(results, 4);
        if (k == 4) rss_after_5 = rss_kib();
    }
    long rss_after_20 = rss_kib();
    printf("capi: rss after 5 calls %ld KiB, after 20 calls %ld KiB\n", rss_after_5, rss_after_20);
    if (__asan_init == NULL) {
        CHECK(rss_after_20 - rss_after_5 < 1024, "memory grew by %ld KiB", rss_after_20 - rss_after_5);
    }

    fastpar_context_free(ctx);
    printf("capi: ok\n");
    return 0;
}
