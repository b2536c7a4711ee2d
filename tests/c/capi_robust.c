/* Every fastpar_* function given NULLs, zero, negative and huge sizes, freed and foreign
 * handles, and malformed model files: an error status and a message, never a crash, and
 * the outputs untouched. Then a normal call still works. Prints "robust: ok" at the end;
 * exits non-zero on failure.
 *
 * usage: capi_robust MODEL.gguf MALFORMED.gguf TRUNCATED.gguf */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fastpar.h"

#define CHECK_PREFIX "robust"
#include "check.h"

/* An error status with a message. */
#define FAILS(call, status, what)                                                                  \
    do {                                                                                           \
        fastpar_status s_ = (call);                                                                \
        CHECK(s_ == (status), "%s: status %d, expected %d", what, (int)s_, (int)(status));         \
        CHECK(fastpar_last_error() != NULL && strlen(fastpar_last_error()) > 0, "%s: a message", what); \
        n_checked++;                                                                               \
    } while (0)

static int n_checked = 0;

int main(int argc, char ** argv) {
    CHECK(argc == 4, "usage: capi_robust MODEL.gguf MALFORMED.gguf TRUNCATED.gguf");
    const fastpar_status BAD = FASTPAR_ERR_INVALID_ARGUMENT;
    CHECK(fastpar_last_error() != NULL && fastpar_last_error()[0] == '\0', "no error before any call");
    CHECK(strcmp(fastpar_finish_reason_name((fastpar_finish_reason)-1), "unknown") == 0, "reason -1");
    CHECK(strcmp(fastpar_finish_reason_name((fastpar_finish_reason)1000), "unknown") == 0, "reason 1000");

    /* Loading. On an error *model_out stays as it was. */
    fastpar_model_params mp = fastpar_model_default_params();
    fastpar_model * const SENTINEL_M = (fastpar_model *)(uintptr_t)0x1234;
    fastpar_model * model = SENTINEL_M;
    FAILS(fastpar_model_load(NULL, mp, &model), BAD, "NULL path");
    FAILS(fastpar_model_load(argv[1], mp, NULL), BAD, "NULL model_out");
    FAILS(fastpar_model_load("", mp, &model), FASTPAR_ERR_NOT_FOUND, "empty path");
    FAILS(fastpar_model_load("/", mp, &model), BAD, "a directory");
    FAILS(fastpar_model_load(argv[2], mp, &model), FASTPAR_ERR_MODEL_LOAD, "malformed model");
    CHECK(strstr(fastpar_last_error(), "block_count") != NULL, "the message names the key");
    FAILS(fastpar_model_load(argv[3], mp, &model), FASTPAR_ERR_MODEL_LOAD, "truncated model");
    fastpar_model_params bad_mp = mp;
    bad_mp.n_gpu_layers = -2;
    FAILS(fastpar_model_load(argv[1], bad_mp, &model), BAD, "n_gpu_layers -2");
    bad_mp.n_gpu_layers = INT32_MIN;
    FAILS(fastpar_model_load(argv[1], bad_mp, &model), BAD, "n_gpu_layers INT32_MIN");
    CHECK(model == SENTINEL_M, "model_out untouched on errors");

    mp = test_model_params();
    /* Freed while `model` lives, so no later model can take its address (a freed handle
       whose address a new handle of its kind took is that handle). */
    CHECK(fastpar_model_load(argv[1], mp, &model) == FASTPAR_OK, "load");
    fastpar_model * freed_model = NULL;
    CHECK(fastpar_model_load(argv[1], mp, &freed_model) == FASTPAR_OK, "load");
    fastpar_model_free(freed_model);
    CHECK(fastpar_last_error()[0] == '\0', "a first free is no error");
    fastpar_model_free(freed_model); /* twice: nothing happens */
    CHECK(strstr(fastpar_last_error(), "not a live handle") != NULL, "a second free says so");

    /* Contexts. */
    int not_a_handle = 7;
    fastpar_context_params cp = fastpar_context_default_params();
    cp.n_parallel = 2;
    cp.n_ctx_per_seq = 128;
    cp.n_threads = 1;
    fastpar_context * const SENTINEL_C = (fastpar_context *)(uintptr_t)0x5678;
    fastpar_context * ctx = SENTINEL_C;
    FAILS(fastpar_context_new(NULL, cp, &ctx), BAD, "NULL model");
    FAILS(fastpar_context_new(model, cp, NULL), BAD, "NULL ctx_out");
    FAILS(fastpar_context_new(freed_model, cp, &ctx), BAD, "freed model");
    CHECK(strstr(fastpar_last_error(), "not a live handle") != NULL, "freed model: the message says so");
    FAILS(fastpar_context_new((fastpar_model *)&not_a_handle, cp, &ctx), BAD, "foreign model pointer");
    const int32_t sizes[] = {0, -1, INT32_MIN, 257, INT32_MAX};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; ++i) {
        fastpar_context_params p = cp;
        p.n_parallel = sizes[i];
        FAILS(fastpar_context_new(model, p, &ctx), BAD, "n_parallel");
        p = cp;
        p.n_ctx_per_seq = sizes[i] == 257 ? 1 : sizes[i];
        if (p.n_ctx_per_seq != INT32_MAX) FAILS(fastpar_context_new(model, p, &ctx), BAD, "n_ctx_per_seq");
        p = cp;
        p.n_threads = sizes[i] == 0 ? -5 : sizes[i];
        if (p.n_threads < 0 || p.n_threads == INT32_MAX) FAILS(fastpar_context_new(model, p, &ctx), BAD, "n_threads");
        p = cp;
        p.n_batch = sizes[i] == 0 ? 1 : sizes[i];   /* below n_parallel, or negative */
        if (p.n_batch < cp.n_parallel) FAILS(fastpar_context_new(model, p, &ctx), BAD, "n_batch");
    }
    /* A huge n_batch is a context's worth: no step holds more tokens than the context. */
    fastpar_context * big_batch = NULL;
    fastpar_context_params p = cp;
    p.n_batch = INT32_MAX;
    CHECK(fastpar_context_new(model, p, &big_batch) == FASTPAR_OK, "n_batch INT32_MAX");
    fastpar_context_free(big_batch);
    p = cp;
    p.n_parallel = 256;
    p.n_ctx_per_seq = INT32_MAX / 128;
    FAILS(fastpar_context_new(model, p, &ctx), BAD, "n_parallel x n_ctx_per_seq overflow");
    p = cp;
    p.n_ctx_per_seq = INT32_MAX / 2; /* a KV cache no machine has */
    CHECK(fastpar_context_new(model, p, &ctx) != FASTPAR_OK && strlen(fastpar_last_error()) > 0, "huge KV cache");
    p = cp;
    p.device_sampling = 2;
    FAILS(fastpar_context_new(model, p, &ctx), BAD, "device_sampling 2");
    p = cp;
    p.warmup = -7;
    FAILS(fastpar_context_new(model, p, &ctx), BAD, "warmup -7");
    CHECK(ctx == SENTINEL_C, "ctx_out untouched on errors");

    fastpar_stats stats;
    fastpar_context * freed_ctx = NULL;
    CHECK(fastpar_context_new(model, cp, &freed_ctx) == FASTPAR_OK, "context");
    CHECK(fastpar_context_new(model, cp, &ctx) == FASTPAR_OK, "context");
    /* A handle of one kind never passes for another, whatever the allocator reuses. */
    FAILS(fastpar_context_new((fastpar_model *)ctx, cp, &freed_ctx), BAD, "a context as a model");
    fastpar_model_free((fastpar_model *)ctx);
    CHECK(strstr(fastpar_last_error(), "not a live handle") != NULL, "a context freed as a model says so");
    FAILS(fastpar_context_last_stats((fastpar_context *)model, &stats), BAD, "a model as a context");
    fastpar_context_free(freed_ctx);
    fastpar_context_free(freed_ctx);
    CHECK(strstr(fastpar_last_error(), "not a live handle") != NULL, "a second context free says so");
    fastpar_context_free((fastpar_context *)&not_a_handle);
    CHECK(strstr(fastpar_last_error(), "not a live handle") != NULL, "a foreign context free says so");
    fastpar_model_free((fastpar_model *)&not_a_handle);
    CHECK(strstr(fastpar_last_error(), "not a live handle") != NULL, "a foreign model free says so");

    /* Generation. On an error *results_out stays as it was. */
    fastpar_generate_params gp = fastpar_generate_default_params();
    gp.max_tokens = 4;
    gp.temperature = 0.0f;
    const char * prompts[2] = {"The capital of France is", "Water boils at"};
    fastpar_completion * const SENTINEL_R = (fastpar_completion *)(uintptr_t)0x9abc;
    fastpar_completion * results = SENTINEL_R;
    FAILS(fastpar_generate_parallel(NULL, prompts, 2, gp, &results), BAD, "NULL ctx");
    FAILS(fastpar_generate_parallel(freed_ctx, prompts, 2, gp, &results), BAD, "freed ctx");
    FAILS(fastpar_generate_parallel((fastpar_context *)&not_a_handle, prompts, 2, gp, &results), BAD, "foreign ctx");
    FAILS(fastpar_generate_parallel(ctx, prompts, 2, gp, NULL), BAD, "NULL results_out");
    FAILS(fastpar_generate_parallel(ctx, NULL, 2, gp, &results), BAD, "NULL prompts");
    FAILS(fastpar_generate_parallel(ctx, prompts, -1, gp, &results), BAD, "n_prompts -1");
    FAILS(fastpar_generate_parallel(ctx, prompts, INT32_MIN, gp, &results), BAD, "n_prompts INT32_MIN");
    const char * with_null[2] = {"ok", NULL};
    FAILS(fastpar_generate_parallel(ctx, with_null, 2, gp, &results), BAD, "a NULL prompt");
    const char * stops[2] = {"x", NULL};
    const char * empty_stop[1] = {""};
    struct {
        const char * what;
        fastpar_generate_params p;
    } bad_gp[20];
    int n_bad = 0;
#define BAD_GP(field, value)                      \
    do {                                          \
        bad_gp[n_bad].what = #field " " #value;   \
        bad_gp[n_bad].p = gp;                     \
        bad_gp[n_bad].p.field = (value);          \
        n_bad++;                                  \
    } while (0)
    BAD_GP(max_tokens, -1);
    BAD_GP(max_tokens, INT32_MIN);
    BAD_GP(temperature, NAN);
    BAD_GP(temperature, -1.0f);
    BAD_GP(temperature, INFINITY);
    BAD_GP(top_p, 0.0f);
    BAD_GP(top_p, NAN);
    BAD_GP(top_k, -1);
    BAD_GP(min_p, 2.0f);
    BAD_GP(repeat_penalty, 0.0f);
    BAD_GP(presence_penalty, NAN);
    BAD_GP(repeat_last_n, -1);
    BAD_GP(seed, -2);
    BAD_GP(seed, INT64_MAX);
    BAD_GP(n_stop, -1);
    BAD_GP(n_stop, 1); /* with stop NULL */
    BAD_GP(n_stop, 2); /* stop set below: its second entry is NULL */
    bad_gp[n_bad - 1].p.stop = stops;
    BAD_GP(n_stop, 1); /* an empty stop string */
    bad_gp[n_bad - 1].p.stop = empty_stop;
    for (int i = 0; i < n_bad; ++i) {
        FAILS(fastpar_generate_parallel(ctx, prompts, 2, bad_gp[i].p, &results), BAD, bad_gp[i].what);
        FAILS(fastpar_generate_parallel(ctx, prompts, 0, bad_gp[i].p, &results), BAD, bad_gp[i].what);
    }
    CHECK(results == SENTINEL_R, "results_out untouched on errors");
    FAILS(fastpar_context_last_stats(NULL, &stats), BAD, "stats of NULL ctx");
    FAILS(fastpar_context_last_stats(ctx, NULL), BAD, "stats into NULL");
    FAILS(fastpar_context_last_stats(freed_ctx, &stats), BAD, "stats of a freed ctx");

    /* Per-prompt failures: the call succeeds. */
    char * huge = malloc(1 << 20);
    CHECK(huge != NULL, "malloc");
    for (int i = 0; i < (1 << 20) - 1; ++i) huge[i] = "word "[i % 5];
    huge[(1 << 20) - 1] = '\0';
    const char * odd[3] = {"", huge, "The quick brown fox"};
    fastpar_generate_params long_gp = gp;
    long_gp.max_tokens = INT32_MAX; /* ends when the sequence's context is full */
    CHECK(fastpar_generate_parallel(ctx, odd, 3, long_gp, &results) == FASTPAR_OK, "odd prompts");
    CHECK(results[0].finish_reason == FASTPAR_FINISH_ERROR && results[0].error != NULL, "empty prompt fails alone");
    CHECK(results[1].finish_reason == FASTPAR_FINISH_ERROR && results[1].error != NULL, "1 MB prompt fails alone");
    CHECK(results[2].finish_reason == FASTPAR_FINISH_LENGTH && results[2].n_gen_tokens > 0, "the third runs to length");
    free(huge);

    /* Freeing results: a wrong count frees the whole array; a second free does nothing. */
    fastpar_results_free(results, 1);
    CHECK(strstr(fastpar_last_error(), "n_results") != NULL, "a wrong count says so");
    fastpar_results_free(results, 3);
    CHECK(strstr(fastpar_last_error(), "not a live handle") != NULL, "a second results free says so");
    fastpar_completion * foreign = calloc(2, sizeof(fastpar_completion));
    fastpar_results_free(foreign, 2);
    CHECK(strstr(fastpar_last_error(), "not a live handle") != NULL, "a foreign results free says so");
    free(foreign);
    fastpar_results_free(NULL, 5);

    /* After all that, the library still works. */
    CHECK(fastpar_generate_parallel(ctx, prompts, 2, gp, &results) == FASTPAR_OK, "generate");
    CHECK(fastpar_last_error()[0] == '\0', "a success clears the message");
    for (int i = 0; i < 2; ++i) {
        CHECK(results[i].finish_reason != FASTPAR_FINISH_ERROR && results[i].n_gen_tokens > 0, "prompt %d", i);
    }
    CHECK(fastpar_context_last_stats(ctx, &stats) == FASTPAR_OK && stats.n_prompts == 2, "stats");
    fastpar_results_free(results, 2);
    fastpar_context_free(ctx);
    fastpar_model_free(model);
    CHECK(fastpar_last_error()[0] == '\0', "the frees are clean");
    printf("robust: %d error cases\n", n_checked);
    printf("robust: ok\n");
    return 0;
}
