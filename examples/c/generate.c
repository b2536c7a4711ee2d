/* A C consumer of fastpar: every prompt on the command line through one model, in one call.
 *
 *   generate MODEL.gguf PROMPT [PROMPT ...]
 *
 * Greedy, at most 48 new tokens each; one slot per prompt (up to 8, more are queued).
 * Prints each answer with its finish reason, then the call's statistics. Build: README.md. */
#include <stdio.h>
#include <stdlib.h>

#include "fastpar.h"

int main(int argc, char ** argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL.gguf PROMPT [PROMPT ...]\n", argv[0]);
        return 2;
    }
    const int32_t n_prompts = argc - 2;
    const char * const * prompts = (const char * const *)(argv + 2);

    fastpar_model * model = NULL;
    if (fastpar_model_load(argv[1], fastpar_model_default_params(), &model) != FASTPAR_OK) {
        fprintf(stderr, "cannot load %s: %s\n", argv[1], fastpar_last_error());
        return 1;
    }
    fastpar_context_params cp = fastpar_context_default_params();
    cp.n_parallel = n_prompts < 8 ? n_prompts : 8;
    cp.n_ctx_per_seq = 512;
    fastpar_context * ctx = NULL;
    fastpar_status status = fastpar_context_new(model, cp, &ctx);
    fastpar_model_free(model); /* the context keeps what it needs */
    if (status != FASTPAR_OK) {
        fprintf(stderr, "cannot create a context: %s\n", fastpar_last_error());
        return 1;
    }

    fastpar_generate_params gp = fastpar_generate_default_params();
    gp.temperature = 0.0f; /* greedy */
    gp.max_tokens = 48;
    fastpar_completion * results = NULL;
    if (fastpar_generate_parallel(ctx, prompts, n_prompts, gp, &results) != FASTPAR_OK) {
        fprintf(stderr, "generate failed: %s\n", fastpar_last_error());
        fastpar_context_free(ctx);
        return 1;
    }
    int n_failed = 0;
    for (int32_t i = 0; i < n_prompts; ++i) {
        const fastpar_completion * c = &results[i];
        printf("[%d] %s (%s, %d tokens):", i, prompts[i], fastpar_finish_reason_name(c->finish_reason), c->n_gen_tokens);
        for (int32_t t = 0; t < c->n_gen_tokens; ++t) printf(" %d", c->token_ids[t]);
        printf("\n%s\n", c->finish_reason == FASTPAR_FINISH_ERROR ? c->error : c->text);
        n_failed += c->finish_reason == FASTPAR_FINISH_ERROR;
    }
    fastpar_stats stats;
    if (fastpar_context_last_stats(ctx, &stats) == FASTPAR_OK) {
        printf("fastpar %s (%s): %lld prompt + %lld generated tokens in %.1f ms, %.1f tokens/s\n", fastpar_version(),
               fastpar_backend(), (long long)stats.n_prompt_tokens, (long long)stats.n_gen_tokens, stats.t_wall_ms,
               stats.total_tokens_per_s);
    }
    fastpar_results_free(results, n_prompts);
    fastpar_context_free(ctx);
    return n_failed == 0 ? 0 : 1;
}
