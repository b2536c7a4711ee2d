/* Stage 1 of bench/run.py: the C ABI from a C program.
 * usage: bench_capi MODEL PROMPTS_FILE N_PARALLEL N_CTX_PER_SEQ MAX_TOKENS TEMPERATURE TOP_K TOP_P N_THREADS
 *        [N_GPU_LAYERS [RUNS]]
 * PROMPTS_FILE holds one prompt per line. Runs them all in one fastpar_generate_parallel
 * call (ignore_eos), RUNS times (default 1) on one context, and prints one JSON line: every
 * call's wall seconds and the last call's token counts. */
#define _POSIX_C_SOURCE 200809L  /* strdup, clock_gettime */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fastpar.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char ** argv) {
    if (argc < 10 || argc > 12) {
        fprintf(stderr, "usage: %s MODEL PROMPTS N_PARALLEL N_CTX_PER_SEQ MAX_TOKENS TEMP TOP_K TOP_P N_THREADS "
                "[N_GPU_LAYERS [RUNS]]\n", argv[0]);
        return 2;
    }
    const int runs = argc == 12 ? atoi(argv[11]) : 1;
    if (runs < 1) {
        fprintf(stderr, "RUNS must be at least 1\n");
        return 2;
    }
    FILE * f = fopen(argv[2], "r");
    if (!f) {
        perror(argv[2]);
        return 2;
    }
    int32_t n = 0, cap = 64;
    char ** prompts = malloc(sizeof(char *) * (size_t)cap);
    char line[1 << 16];
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        if (n == cap) {
            cap *= 2;
            prompts = realloc(prompts, sizeof(char *) * (size_t)cap);
        }
        prompts[n++] = strdup(line);
    }
    fclose(f);

    fastpar_model * model = NULL;
    fastpar_context * ctx = NULL;
    fastpar_model_params mp = fastpar_model_default_params();
    if (argc >= 11) mp.n_gpu_layers = atoi(argv[10]);
    if (fastpar_model_load(argv[1], mp, &model) != FASTPAR_OK) {
        fprintf(stderr, "load: %s\n", fastpar_last_error());
        return 1;
    }
    fastpar_context_params cp = fastpar_context_default_params();
    cp.n_parallel = atoi(argv[3]);
    cp.n_ctx_per_seq = atoi(argv[4]);
    cp.n_threads = atoi(argv[9]);
    if (fastpar_context_new(model, cp, &ctx) != FASTPAR_OK) {
        fprintf(stderr, "context: %s\n", fastpar_last_error());
        return 1;
    }
    fastpar_model_free(model);
    fastpar_generate_params gp = fastpar_generate_default_params();
    gp.max_tokens = atoi(argv[5]);
    gp.temperature = (float)atof(argv[6]);
    gp.top_k = atoi(argv[7]);
    gp.top_p = (float)atof(argv[8]);
    gp.min_p = 0.0f;
    gp.seed = 42;
    gp.ignore_eos = true;

    fastpar_completion * results = NULL;
    double * walls = malloc(sizeof(double) * (size_t)runs);
    for (int r = 0; r < runs; ++r) {
        if (results) fastpar_results_free(results, n);
        results = NULL;
        const double t0 = now_s();
        if (fastpar_generate_parallel(ctx, (const char * const *)prompts, n, gp, &results) != FASTPAR_OK) {
            fprintf(stderr, "generate: %s\n", fastpar_last_error());
            return 1;
        }
        walls[r] = now_s() - t0;
    }
    long long n_prompt = 0, n_gen = 0;
    int failed = 0;
    for (int32_t i = 0; i < n; ++i) {
        n_prompt += results[i].n_prompt_tokens;
        n_gen += results[i].n_gen_tokens;
        failed += results[i].finish_reason == FASTPAR_FINISH_ERROR;
    }
    printf("{\"walls_s\": [");
    for (int r = 0; r < runs; ++r) printf("%s%.6f", r ? ", " : "", walls[r]);
    printf("], \"n_prompt_tokens\": %lld, \"n_gen_tokens\": %lld, \"failed\": %d}\n", n_prompt, n_gen, failed);
    free(walls);
    fastpar_results_free(results, n);
    fastpar_context_free(ctx);
    for (int32_t i = 0; i < n; ++i) free(prompts[i]);
    free(prompts);
    return failed ? 1 : 0;
}
