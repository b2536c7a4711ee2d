/* Exercises fastpar_generate from plain C: parameters per prompt, n samples, chat-message
 * prompts, top log-probabilities and argument errors. Prints "capi-gen: ..." lines the
 * pytest driver compares with Python; exits non-zero on failure. */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fastpar.h"

#define CHECK_PREFIX "capi-gen"
#include "check.h"

/* An interrupt check that fires at its (limit + 1)-th poll. */
static int g_polls;
static bool stop_after(void * limit) { return ++g_polls > *(const int *) limit; }

static int same_tokens(const fastpar_completion * a, const fastpar_completion * b, int32_t n) {
    for (int32_t k = 0; k < n; ++k) {
        if (a[k].n_gen_tokens != b[k].n_gen_tokens ||
            memcmp(a[k].token_ids, b[k].token_ids, sizeof(int32_t) * (size_t) a[k].n_gen_tokens) != 0) {
            return 0;
        }
    }
    return 1;
}

int main(int argc, char ** argv) {
    CHECK(argc == 2, "usage: capi_generate MODEL.gguf");
    fastpar_model * model = NULL;
    fastpar_context * ctx = NULL;
    fastpar_context_params cp = fastpar_context_default_params();
    cp.n_parallel = 4;
    cp.n_ctx_per_seq = 256;
    fastpar_model_params mp = test_model_params();
    CHECK(fastpar_model_load(argv[1], mp, &model) == FASTPAR_OK, "load");
    CHECK(fastpar_context_new(model, cp, &ctx) == FASTPAR_OK, "context");

    const fastpar_message chat[] = {{"user", "What is the capital of France?", NULL, 0, NULL}};
    const fastpar_prompt prompts[3] = {
        {"The capital of France is", NULL, 0},
        {NULL, chat, 1},
        {"Write one sentence about the weather:", NULL, 0},
    };
    fastpar_generate_params params[3];
    for (int i = 0; i < 3; ++i) {
        params[i] = fastpar_generate_default_params();
        params[i].max_tokens = 8;
        params[i].temperature = 0.0f;
    }
    CHECK(params[0].n == 1 && params[0].top_logprobs == 0 && params[0].json_schema == NULL && params[0].grammar == NULL,
          "defaults");
    params[0].top_logprobs = 3;
    params[0].logprobs = true;
    params[2].n = 3;
    params[2].temperature = 1.0f;
    params[2].seed = 7;

    fastpar_completion * results = NULL;
    int32_t n_results = -1;
    CHECK(fastpar_generate(ctx, prompts, 3, params, 3, &results, &n_results) == FASTPAR_OK, "generate");
    CHECK(n_results == 5, "1 + 1 + 3 completions, got %d", n_results);
    for (int32_t k = 0; k < n_results; ++k) {
        const fastpar_completion * c = &results[k];
        CHECK(c->finish_reason != FASTPAR_FINISH_ERROR, "result %d ok", k);
        printf("capi-gen: result %d tokens", k);
        for (int32_t t = 0; t < c->n_gen_tokens; ++t) {
            printf(" %d", c->token_ids[t]);
        }
        printf("|\n");
    }
    const fastpar_completion * c0 = &results[0];
    CHECK(c0->n_top_logprobs == 3 && c0->top_logprob_ids != NULL && c0->top_logprob_values != NULL, "top logprobs");
    for (int32_t t = 0; t < c0->n_gen_tokens; ++t) {
        const int32_t * ids = c0->top_logprob_ids + t * 3;
        const float * values = c0->top_logprob_values + t * 3;
        CHECK(ids[0] == c0->token_ids[t], "greedy token first at %d", t);
        CHECK(values[0] == c0->logprobs[t], "same value as logprobs at %d", t);
        CHECK(values[0] >= values[1] && values[1] >= values[2], "sorted at %d", t);
    }
    CHECK(results[1].n_top_logprobs == 0 && results[1].top_logprob_ids == NULL, "no top logprobs unasked");
    fastpar_stats stats;
    CHECK(fastpar_context_last_stats(ctx, &stats) == FASTPAR_OK && stats.n_prompts == 3, "stats");
    printf("capi-gen: shared %d %d\n", results[3].n_prompt_tokens_shared, results[4].n_prompt_tokens_shared);
    fastpar_results_free(results, n_results);

    /* One params struct for every prompt, and NULL for the defaults. */
    params[2].n = 2;
    CHECK(fastpar_generate(ctx, prompts, 2, &params[2], 1, &results, &n_results) == FASTPAR_OK && n_results == 4,
          "one params for all");
    fastpar_results_free(results, n_results);
    CHECK(fastpar_generate(ctx, prompts, 0, NULL, 0, &results, &n_results) == FASTPAR_OK && results == NULL &&
              n_results == 0,
          "no prompts");

    /* Errors: nothing allocated, a message. */
    results = NULL;
    CHECK(fastpar_generate(ctx, prompts, 3, params, 2, &results, &n_results) == FASTPAR_ERR_INVALID_ARGUMENT &&
              results == NULL,
          "n_params must match");
    CHECK(fastpar_generate(ctx, prompts, 3, params, 3, &results, NULL) == FASTPAR_ERR_INVALID_ARGUMENT, "NULL count");
    const fastpar_prompt both = {"text", chat, 1};
    CHECK(fastpar_generate(ctx, &both, 1, NULL, 0, &results, &n_results) == FASTPAR_ERR_INVALID_ARGUMENT, "both");
    const fastpar_prompt neither = {NULL, NULL, 0};
    CHECK(fastpar_generate(ctx, &neither, 1, NULL, 0, &results, &n_results) == FASTPAR_ERR_INVALID_ARGUMENT, "none");
    const fastpar_message bad_chat[] = {{"user", NULL, NULL, 0, NULL}};
    const fastpar_prompt bad = {NULL, bad_chat, 1};
    CHECK(fastpar_generate(ctx, &bad, 1, NULL, 0, &results, &n_results) == FASTPAR_ERR_INVALID_ARGUMENT, "NULL content");
    fastpar_generate_params bad_gp = fastpar_generate_default_params();
    bad_gp.top_logprobs = 21;
    CHECK(fastpar_generate(ctx, prompts, 1, &bad_gp, 1, &results, &n_results) == FASTPAR_ERR_INVALID_ARGUMENT &&
              strstr(fastpar_last_error(), "top_logprobs") != NULL,
          "top_logprobs 21");
    bad_gp = fastpar_generate_default_params();
    bad_gp.n = 0;
    CHECK(fastpar_generate(ctx, prompts, 1, &bad_gp, 1, &results, &n_results) == FASTPAR_ERR_INVALID_ARGUMENT, "n 0");
    bad_gp.n = 2;
    const char * const text[] = {"x"};
    CHECK(fastpar_generate_parallel(ctx, text, 1, bad_gp, &results) == FASTPAR_ERR_INVALID_ARGUMENT &&
              strstr(fastpar_last_error(), "fastpar_generate") != NULL,
          "generate_parallel refuses n > 1");
    bad_gp = fastpar_generate_default_params();
    bad_gp.json_schema = "{\"type\": \"string\"}";
    bad_gp.grammar = "root ::= \"a\"";
    CHECK(fastpar_generate(ctx, prompts, 1, &bad_gp, 1, &results, &n_results) == FASTPAR_ERR_INVALID_ARGUMENT,
          "schema and grammar");
    CHECK(results == NULL, "nothing allocated on errors");
    bad_gp = fastpar_generate_default_params();
    bad_gp.n_logit_bias = 1; /* and no entries */
    CHECK(fastpar_generate(ctx, prompts, 1, &bad_gp, 1, &results, &n_results) == FASTPAR_ERR_INVALID_ARGUMENT &&
              strstr(fastpar_last_error(), "logit_bias") != NULL,
          "n_logit_bias without entries");

    /* logit_bias: +100 on a token makes every generated token that one, sampled or greedy. */
    const fastpar_logit_bias force[] = {{42, 100.0f}, {7, -INFINITY}};
    fastpar_generate_params biased[2] = {fastpar_generate_default_params(), fastpar_generate_default_params()};
    for (int i = 0; i < 2; ++i) {
        biased[i].max_tokens = 6;
        biased[i].seed = 5;
        biased[i].logit_bias = force;
        biased[i].n_logit_bias = 2;
    }
    biased[1].temperature = 0.0f;
    CHECK(fastpar_generate(ctx, prompts, 2, biased, 2, &results, &n_results) == FASTPAR_OK && n_results == 2,
          "logit_bias");
    for (int k = 0; k < 2; ++k) {
        CHECK(results[k].n_gen_tokens == 6, "logit_bias: 6 tokens");
        for (int32_t i = 0; i < results[k].n_gen_tokens; ++i) {
            CHECK(results[k].token_ids[i] == 42, "logit_bias forces token 42");
        }
    }
    fastpar_results_free(results, n_results);
    results = NULL;

    /* allowed_token_ids: every generated token is one of them (neither ends the output). */
    const int32_t only[] = {42, 43};
    fastpar_generate_params limited = fastpar_generate_default_params();
    limited.max_tokens = 6;
    limited.seed = 5;
    limited.allowed_token_ids = only;
    limited.n_allowed_token_ids = 2;
    CHECK(fastpar_generate(ctx, prompts, 1, &limited, 1, &results, &n_results) == FASTPAR_OK && n_results == 1,
          "allowed_token_ids");
    CHECK(results[0].n_gen_tokens == 6, "allowed_token_ids: 6 tokens");
    for (int32_t i = 0; i < results[0].n_gen_tokens; ++i) {
        CHECK(results[0].token_ids[i] == 42 || results[0].token_ids[i] == 43, "allowed_token_ids: token %d",
              (int) results[0].token_ids[i]);
    }
    fastpar_results_free(results, n_results);
    results = NULL;

    /* regex: the whole text matches it; one outside the supported subset is refused by name. */
    fastpar_generate_params digits = fastpar_generate_default_params();
    digits.max_tokens = 16;
    digits.seed = 5;
    digits.regex = "\\d{3}-[0-9]{2}";
    CHECK(fastpar_generate(ctx, prompts, 1, &digits, 1, &results, &n_results) == FASTPAR_OK && n_results == 1,
          "regex");
    const char * t = results[0].text;
    CHECK(results[0].text_len == 6 && t[3] == '-' && isdigit((unsigned char) t[0]) && isdigit((unsigned char) t[1]) &&
              isdigit((unsigned char) t[2]) && isdigit((unsigned char) t[4]) && isdigit((unsigned char) t[5]),
          "regex: '%s' matches \\d{3}-[0-9]{2}", t);
    fastpar_results_free(results, n_results);
    results = NULL;
    digits.regex = "(?=a)b";
    CHECK(fastpar_generate(ctx, prompts, 1, &digits, 1, &results, &n_results) == FASTPAR_ERR_INVALID_ARGUMENT &&
              strstr(fastpar_last_error(), "regex") != NULL && results == NULL,
          "a regex outside the subset");

    /* reasoning "split": a prompt that opens a thought gets it back apart from the answer (all of
     * it here, where max_tokens cuts the thought short). */
    const fastpar_prompt thinking = {"Q: What is 2+3?\n<think>2 plus 3 is 5.</think>\nA: 5\n\nQ: What is 2+2?\n<think>",
                                     NULL, 0};
    fastpar_generate_params think = fastpar_generate_default_params();
    think.max_tokens = 3;
    think.temperature = 0.0f;
    think.reasoning = "split";
    CHECK(fastpar_generate(ctx, &thinking, 1, &think, 1, &results, &n_results) == FASTPAR_OK && n_results == 1,
          "reasoning");
    CHECK(results[0].reasoning != NULL && results[0].reasoning[0] != '\0' && results[0].text_len == 0,
          "reasoning: the cut thought, no answer");
    fastpar_results_free(results, n_results);
    results = NULL;

    /* The interrupt check: a call it stops returns FASTPAR_ERR_INTERRUPTED, allocates
     * nothing and leaves the context clean (the next call's greedy tokens are those of a
     * call that was never interrupted). */
    fastpar_generate_params long_gp = fastpar_generate_default_params();
    long_gp.max_tokens = 48;
    long_gp.temperature = 0.0f;
    long_gp.ignore_eos = true;
    fastpar_completion * reference = NULL;
    int32_t n_reference = 0;
    CHECK(fastpar_generate(ctx, prompts, 2, &long_gp, 1, &reference, &n_reference) == FASTPAR_OK && n_reference == 2,
          "reference");
    int limit = 3;
    CHECK(fastpar_context_set_interrupt(ctx, stop_after, &limit) == FASTPAR_OK, "set interrupt");
    g_polls = 0;
    results = NULL;
    CHECK(fastpar_generate(ctx, prompts, 2, &long_gp, 1, &results, &n_results) == FASTPAR_ERR_INTERRUPTED &&
              results == NULL && g_polls == limit + 1 && strstr(fastpar_last_error(), "interrupted") != NULL,
          "interrupted after %d polls", g_polls);
    CHECK(fastpar_context_last_stats(ctx, &stats) == FASTPAR_OK && stats.n_gen_tokens < 2 * 48, "stopped early");
    printf("capi-gen: interrupted after %d polls, %d tokens\n", g_polls, (int) stats.n_gen_tokens);
    limit = 1000000;  /* a check that never fires: the call runs as without one */
    g_polls = 0;
    CHECK(fastpar_generate(ctx, prompts, 2, &long_gp, 1, &results, &n_results) == FASTPAR_OK && g_polls >= 48 &&
              same_tokens(results, reference, 2),
          "after an interrupt: same tokens");
    fastpar_results_free(results, n_results);
    CHECK(fastpar_context_set_interrupt(ctx, NULL, NULL) == FASTPAR_OK, "remove interrupt");
    g_polls = 0;
    CHECK(fastpar_generate(ctx, prompts, 2, &long_gp, 1, &results, &n_results) == FASTPAR_OK && g_polls == 0 &&
              same_tokens(results, reference, 2),
          "removed");
    fastpar_results_free(results, n_results);
    fastpar_results_free(reference, n_reference);
    CHECK(fastpar_context_set_interrupt(NULL, stop_after, &limit) == FASTPAR_ERR_INVALID_ARGUMENT, "NULL ctx");

    /* Tools: a chat prompt rendered with them (the default model's template has none: the
     * generic format), a forced call parsed into tool_calls, then a later turn with the call
     * and its result; and the refusals. Prompts with tools are long: a context of their own. */
    fastpar_context * tctx = NULL;
    fastpar_context_params tcp = fastpar_context_default_params();
    tcp.n_parallel = 2;
    tcp.n_ctx_per_seq = 1024;
    CHECK(fastpar_context_new(model, tcp, &tctx) == FASTPAR_OK, "tools context");
    const char * weather = "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
                           "\"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, "
                           "\"required\": [\"city\"]}}}]";
    const fastpar_message ask[] = {{"user", "What is the weather in Paris?", NULL, 0, NULL}};
    const fastpar_prompt asking = {NULL, ask, 1};
    fastpar_generate_params call = fastpar_generate_default_params();
    call.max_tokens = 64;
    call.temperature = 0.0f;
    call.tools = weather;
    call.tool_choice = "required";
    CHECK(fastpar_generate(tctx, &asking, 1, &call, 1, &results, &n_results) == FASTPAR_OK && n_results == 1,
          "tools: %s", fastpar_last_error());
    CHECK(results[0].finish_reason == FASTPAR_FINISH_TOOL_CALLS && results[0].n_tool_calls == 1 &&
              strcmp(results[0].tool_calls[0].name, "get_weather") == 0 &&
              strncmp(results[0].tool_calls[0].id, "call_", 5) == 0 && results[0].text_len == 0,
          "tools: one call of get_weather");
    CHECK(strcmp(fastpar_finish_reason_name(results[0].finish_reason), "tool_calls") == 0, "tool_calls's name");
    printf("capi-gen: tool %s %s\n", results[0].tool_calls[0].name, results[0].tool_calls[0].arguments);
    const fastpar_tool_call made = {"call_1", "get_weather", results[0].tool_calls[0].arguments};
    const fastpar_message turn[] = {{"user", "What is the weather in Paris?", NULL, 0, NULL},
                                    {"assistant", NULL, &made, 1, NULL},
                                    {"tool", "sunny, 21 C", NULL, 0, "call_1"}};
    const fastpar_prompt answering = {NULL, turn, 3};
    fastpar_completion * answer = NULL;
    int32_t n_answer = 0;
    call.tool_choice = NULL; /* auto: the model may answer in text now */
    CHECK(fastpar_generate(tctx, &answering, 1, &call, 1, &answer, &n_answer) == FASTPAR_OK && n_answer == 1 &&
              answer[0].finish_reason != FASTPAR_FINISH_ERROR,
          "tools: a later turn with the result: %s", answer != NULL && answer[0].error ? answer[0].error : "");
    fastpar_results_free(answer, n_answer);
    fastpar_results_free(results, n_results);
    results = NULL;
    call.tool_choice = "required";
    CHECK(fastpar_generate(tctx, prompts, 1, &call, 1, &results, &n_results) == FASTPAR_ERR_INVALID_ARGUMENT &&
              strstr(fastpar_last_error(), "chat messages") != NULL && results == NULL,
          "tools with a raw-text prompt");
    call.tool_choice = "get_time";
    CHECK(fastpar_generate(tctx, &asking, 1, &call, 1, &results, &n_results) == FASTPAR_ERR_INVALID_ARGUMENT &&
              strstr(fastpar_last_error(), "get_time") != NULL,
          "tool_choice naming no tool");
    call.tool_choice = NULL;
    call.regex = "[a-z]+";
    CHECK(fastpar_generate(tctx, &asking, 1, &call, 1, &results, &n_results) == FASTPAR_ERR_INVALID_ARGUMENT &&
              strstr(fastpar_last_error(), "tools cannot be combined") != NULL,
          "tools with regex");
    call.regex = NULL;
    call.tools = "[{\"type\": \"function\"}]";
    CHECK(fastpar_generate(tctx, &asking, 1, &call, 1, &results, &n_results) == FASTPAR_ERR_INVALID_ARGUMENT &&
              strstr(fastpar_last_error(), "each tool") != NULL,
          "a tool without a function");
    call.tools = weather;
    const fastpar_message empty[] = {{"assistant", NULL, NULL, 0, NULL}};
    const fastpar_prompt hollow = {NULL, empty, 1};
    CHECK(fastpar_generate(tctx, &hollow, 1, &call, 1, &results, &n_results) == FASTPAR_ERR_INVALID_ARGUMENT &&
              strstr(fastpar_last_error(), "no tool calls") != NULL,
          "a message with no content and no calls");
    fastpar_context_free(tctx);

    fastpar_context_free(ctx);
    CHECK(fastpar_context_set_interrupt(ctx, NULL, NULL) == FASTPAR_ERR_INVALID_ARGUMENT, "freed ctx");
    fastpar_model_free(model);
    printf("capi-gen: ok\n");
    return 0;
}
