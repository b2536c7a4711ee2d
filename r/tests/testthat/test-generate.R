prompts <- c("The capital of France is", "Here is a short poem about the sea:\n", "def fibonacci(n):\n",
             "Water boils at")

test_that("greedy outputs equal Python's, token for token", {
  ctx <- test_context()
  res <- generate_parallel(ctx, prompts, max_tokens = 24, temperature = 0)
  expect_s3_class(res, "data.frame")
  expect_identical(names(res), c("text", "finish_reason", "error", "n_prompt_tokens", "n_prompt_tokens_shared",
                                 "n_prompt_tokens_cached", "n_gen_tokens", "token_ids"))
  expect_identical(nrow(res), length(prompts))
  expect_true(all(res$finish_reason %in% c("stop", "length")))
  expect_true(all(is.na(res$error)))
  expect_identical(res$n_gen_tokens, lengths(res$token_ids))
  expect_true(all(res$n_prompt_tokens + res$n_prompt_tokens_shared > 0))
  expect_identical(res$token_ids, python_tokens(as.list(prompts), max_tokens = 24))
  stats <- attr(res, "stats")
  expect_identical(stats$n_prompts, 4)
  expect_identical(stats$n_gen_tokens, as.double(sum(res$n_gen_tokens)))
  expect_identical(stats, fastpar_last_stats(ctx))
})

test_that("chat messages are rendered with the model's template, as in Python", {
  ctx <- test_context()
  chat <- list(list(role = "user", content = "What is the capital of France?"))
  as_df <- data.frame(role = "user", content = "What is the capital of France?")
  res <- generate_parallel(ctx, list(chat, "Water boils at", as_df), max_tokens = 12, temperature = 0)
  expect_identical(res$token_ids[[1]], res$token_ids[[3]])
  want <- python_tokens(list(list(chat = "What is the capital of France?"), "Water boils at"), max_tokens = 12)
  expect_identical(res$token_ids[1:2], want)
  expect_false(identical(res$token_ids[[1]], generate_parallel(ctx, "What is the capital of France?",
                                                               max_tokens = 12, temperature = 0)$token_ids[[1]]))
})

test_that("options are per prompt, recycled from length 1", {
  ctx <- test_context()
  res <- generate_parallel(ctx, prompts[1:3], max_tokens = c(3, 5, 7), temperature = 0, ignore_eos = TRUE)
  expect_identical(res$n_gen_tokens, c(3L, 5L, 7L))
  expect_identical(res$finish_reason, rep("length", 3))
  alone <- generate_parallel(ctx, prompts[2], max_tokens = 5, temperature = 0, ignore_eos = TRUE)
  expect_identical(res$token_ids[[2]], alone$token_ids[[1]])
  # stop strings: for all prompts, or one set per prompt; the text ends before them.
  full <- generate_parallel(ctx, prompts[1], max_tokens = 24, temperature = 0)$text
  cut <- substr(full, 4, 6)
  res <- generate_parallel(ctx, prompts[1:2], max_tokens = 24, temperature = 0, stop = list(cut, character(0)))
  expect_identical(res$finish_reason[1], "stop")
  expect_identical(res$text[1], substr(full, 1, 3))
  expect_identical(generate_parallel(ctx, prompts[1], max_tokens = 24, temperature = 0, stop = cut)$text,
                   substr(full, 1, 3))
  # logprobs: one per generated token, and not positive.
  res <- generate_parallel(ctx, prompts[1:2], max_tokens = 6, temperature = 0, logprobs = c(TRUE, FALSE))
  expect_identical(length(res$logprobs[[1]]), res$n_gen_tokens[1])
  expect_true(all(res$logprobs[[1]] <= 0))
  expect_identical(res$logprobs[[2]], numeric(0))
  # top_logprobs: per row, a generated token per matrix row and its k best tokens, best
  # first; greedy picks the best, so its first column is the tokens and their logprobs.
  res <- generate_parallel(ctx, prompts[1:2], max_tokens = 6, temperature = 0, logprobs = TRUE,
                           top_logprobs = c(3, 0))
  top <- res$top_logprobs[[1]]
  expect_identical(dim(top$token_ids), c(res$n_gen_tokens[1], 3L))
  expect_identical(dim(top$logprobs), c(res$n_gen_tokens[1], 3L))
  expect_identical(top$token_ids[, 1], res$token_ids[[1]])
  expect_equal(top$logprobs[, 1], res$logprobs[[1]], tolerance = 1e-6)
  expect_true(all(top$logprobs[, 1] >= top$logprobs[, 2] & top$logprobs[, 2] >= top$logprobs[, 3]))
  expect_identical(ncol(res$top_logprobs[[2]]$token_ids), 0L)
  expect_null(generate_parallel(ctx, prompts[1], max_tokens = 2, temperature = 0)$top_logprobs)
})

test_that("n samples give one row per sample, with prompt and sample indices", {
  ctx <- test_context()
  res <- generate_parallel(ctx, prompts[1:2], max_tokens = 8, temperature = 1, seed = 7, n = c(1, 3),
                           ignore_eos = TRUE)
  expect_identical(nrow(res), 4L)
  expect_identical(res$prompt_index, c(1L, 2L, 2L, 2L))
  expect_identical(res$sample_index, c(1L, 1L, 2L, 3L))
  expect_identical(names(res)[1:2], c("prompt_index", "sample_index"))
  expect_true(all(res$n_prompt_tokens_shared[3:4] > 0))  # the prompt was decoded once
  again <- generate_parallel(ctx, prompts[1:2], max_tokens = 8, temperature = 1, seed = 7, n = c(1, 3),
                             ignore_eos = TRUE)
  expect_identical(again$token_ids, res$token_ids)  # seeded: repeatable
  expect_gt(length(unique(res$token_ids[2:4])), 1)  # seeds 7, 8, 9: different samples
})

test_that("a prompt that cannot be served fails alone, in its row", {
  ctx <- test_context(n_parallel = 2, n_ctx_per_seq = 64)
  good <- c("The capital of France is", "Water boils at")
  res <- generate_parallel(ctx, c(good[1], strrep("word ", 200), good[2]), max_tokens = 8, temperature = 0)
  expect_identical(res$finish_reason[2], "error")
  expect_match(res$error[2], "context|long|n_ctx", ignore.case = TRUE)
  expect_identical(res$n_gen_tokens[2], 0L)
  expect_true(all(is.na(res$error[c(1, 3)])))
  alone <- generate_parallel(ctx, good, max_tokens = 8, temperature = 0)
  expect_identical(res$token_ids[c(1, 3)], alone$token_ids)
  expect_identical(attr(res, "stats")$n_failed, 1)
})

test_that("a repeated call gives the same results: nothing is left behind", {
  ctx <- test_context()
  first <- generate_parallel(ctx, prompts, max_tokens = 16, temperature = 0)
  generate_parallel(ctx, c(strrep("word ", 600), "x"), max_tokens = 4, temperature = 0)  # one fails
  generate_parallel(ctx, prompts[4:1], max_tokens = 3, temperature = 0.9, seed = 3)
  second <- generate_parallel(ctx, prompts, max_tokens = 16, temperature = 0)
  expect_identical(second[, names(second) != "token_ids"], first[, names(first) != "token_ids"])
  expect_identical(second$token_ids, first$token_ids)
  none <- generate_parallel(ctx, character(0))
  expect_identical(nrow(none), 0L)
  expect_null(attr(none, "stats"))
})

test_that("json_schema output parses and follows the schema", {
  skip_if_not_installed("jsonlite")
  ctx <- test_context()
  schema <- jsonlite::toJSON(list(
    type = "object", required = c("city", "year"),
    properties = list(city = list(type = "string", maxLength = 20),
                      year = list(type = "integer", minimum = 0, maximum = 2100))), auto_unbox = TRUE)
  docs <- c("Paris hosted the Olympics in 1924.", "Tokyo hosted them in 1964.")
  chats <- lapply(docs, function(d) list(list(role = "user", content = paste("Extract city and year as JSON:", d))))
  res <- generate_parallel(ctx, c(chats, list("Free text:")), json_schema = c(schema, schema, NA),
                           temperature = 0, max_tokens = 64)
  expect_identical(res$finish_reason[1:2], c("stop", "stop"))
  for (text in res$text[1:2]) {
    value <- jsonlite::fromJSON(text)
    expect_true(is.character(value$city) && nchar(value$city) <= 20)
    expect_true(is.numeric(value$year) && value$year == round(value$year) && value$year >= 0)
  }
  # NA: that prompt has no schema, and gives what it gives without one.
  free <- generate_parallel(ctx, "Free text:", temperature = 0, max_tokens = 64)
  expect_identical(res$token_ids[[3]], free$token_ids[[1]])
})

test_that("Ctrl-C cancels the call and leaves the context clean", {
  skip_on_os("windows")
  ctx <- test_context()
  before <- generate_parallel(ctx, prompts, max_tokens = 16, temperature = 0)
  # A real SIGINT, as Ctrl-C sends, half a second into a call that would run far longer.
  system(sprintf("(sleep 0.5; kill -INT %d) >/dev/null 2>&1 &", Sys.getpid()))
  t0 <- proc.time()[["elapsed"]]
  caught <- tryCatch(generate_parallel(ctx, prompts, max_tokens = 100000, temperature = 0, ignore_eos = TRUE),
                     interrupt = function(e) e)
  elapsed <- proc.time()[["elapsed"]] - t0
  expect_s3_class(caught, "fastpar_interrupt")
  stats <- fastpar_last_stats(ctx)
  expect_identical(stats$n_prompts, 4)
  expect_lt(stats$n_gen_tokens, 4 * 500)  # cancelled long before the contexts were full
  expect_lt(elapsed, 30)
  after <- generate_parallel(ctx, prompts, max_tokens = 16, temperature = 0)
  expect_identical(after$token_ids, before$token_ids)
})

test_that("choice makes every output one of the labels, per prompt or for all", {
  ctx <- test_context()
  labels <- c("yes", "no", "maybe so")
  out <- generate_parallel(ctx, c("Is the sky blue?", "Is fire cold?", "Is 2 > 1?"), choice = labels,
                           temperature = 1, seed = 4, max_tokens = 8)
  expect_true(all(out$text %in% labels))
  out <- generate_parallel(ctx, c("Colour?", "Number?"), choice = list(c("red", "blue"), c("one", "two")),
                           temperature = 1, seed = 4, max_tokens = 8)
  expect_true(out$text[1] %in% c("red", "blue") && out$text[2] %in% c("one", "two"))
  expect_error(generate_parallel(ctx, "Hi", choice = list("a", "b", "c")), "one per prompt")
})

test_that("regex makes every output match it whole, per prompt or for all", {
  ctx <- test_context()
  out <- generate_parallel(ctx, c("Call me at", "My number:"), regex = "\\d{3}-\\d{4}",
                           temperature = 1, seed = 4, max_tokens = 16)
  expect_true(all(grepl("^[0-9]{3}-[0-9]{4}$", out$text)))
  out <- generate_parallel(ctx, c("Colour?", "Year?"), regex = c("(red|blue)", "(19|20)\\d\\d"),
                           temperature = 1, seed = 4, max_tokens = 8)
  expect_true(out$text[1] %in% c("red", "blue") && grepl("^(19|20)[0-9]{2}$", out$text[2]))
  expect_error(generate_parallel(ctx, "Hi", regex = "(?=a)b"), "outside the supported subset")
})

test_that("allowed_token_ids keeps every generated token among them, per prompt or for all", {
  ctx <- test_context()
  out <- generate_parallel(ctx, c("One", "Two"), allowed_token_ids = list(c(42, 43, 44), 7),
                           temperature = 1, seed = 4, max_tokens = 6)
  expect_equal(out$n_gen_tokens, c(6L, 6L))  # no end-of-generation token among them
  expect_true(all(out$token_ids[[1]] %in% c(42L, 43L, 44L)) && all(out$token_ids[[2]] == 7L))
  expect_error(generate_parallel(ctx, "Hi", allowed_token_ids = -1), "token ids")
})

test_that("reasoning = 'split' puts an opened thought in a reasoning column", {
  ctx <- test_context()
  prompt <- "Q: What is 2+3?\n<think>2 plus 3 is 5.</think>\nA: 5\n\nQ: What is 2+2?\n<think>"
  out <- generate_parallel(ctx, c(prompt, "Hello"), reasoning = c("split", NA), temperature = 0, max_tokens = 3)
  expect_true(nchar(out$reasoning[1]) > 0 && out$text[1] == "")  # cut short inside the thought
  expect_equal(out$reasoning[2], "")
  expect_null(generate_parallel(ctx, "Hello", max_tokens = 2)$reasoning)
})

test_that("tools: a forced call in a tool_calls column, as Python makes it, and a later turn", {
  ctx <- test_context(2, 1024)
  weather <- paste0('[{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", ',
                    '"properties": {"city": {"type": "string"}}, "required": ["city"]}}}]')
  ask <- list(list(role = "user", content = "What is the weather in Paris?"))
  out <- generate_parallel(ctx, list(ask), tools = weather, tool_choice = "required", temperature = 0,
                           max_tokens = 64)
  expect_identical(out$finish_reason, "tool_calls")
  calls <- out$tool_calls[[1]]
  expect_s3_class(calls, "data.frame")
  expect_identical(names(calls), c("id", "name", "arguments"))
  expect_identical(calls$name, "get_weather")
  expect_true(startsWith(calls$id, "call_"))
  expect_identical(out$token_ids, python_tokens(list(list(chat = "What is the weather in Paris?")), max_tokens = 64,
                                                n_parallel = 2, n_ctx_per_seq = 1024, tools = weather))
  turn <- c(ask, list(list(role = "assistant", tool_calls = calls),
                      list(role = "tool", content = "sunny, 21 C", tool_call_id = calls$id)))
  answer <- generate_parallel(ctx, list(turn), tools = weather, temperature = 0, max_tokens = 16)
  expect_true(answer$finish_reason %in% c("stop", "length", "tool_calls"))
  expect_null(generate_parallel(ctx, list(ask), max_tokens = 2)$tool_calls)
  expect_error(generate_parallel(ctx, "Hello", tools = weather), "must be chat messages")
  expect_error(generate_parallel(ctx, list(ask), tools = weather, tool_choice = "get_time"), "get_time")
  expect_error(generate_parallel(ctx, list(list(list(role = "assistant", tool_calls = "x"))), tools = weather),
               "tool_calls is a data.frame")
})

test_that("logit_bias forces and bans tokens, per prompt or for all", {
  ctx <- test_context()
  prompts <- c("The capital of France is", "Water boils at")
  out <- generate_parallel(ctx, prompts, logit_bias = c("42" = 100), temperature = 1, seed = 2, max_tokens = 5)
  expect_true(all(vapply(out$token_ids, function(t) all(t == 42L), TRUE)))
  plain <- generate_parallel(ctx, prompts, temperature = 0, max_tokens = 5)
  first <- plain$token_ids[[1]][1]
  ban <- stats::setNames(c(-Inf, 100), c(first, 42))
  out <- generate_parallel(ctx, prompts, logit_bias = list(ban[1], ban[2]), temperature = 0, max_tokens = 5)
  expect_false(first %in% out$token_ids[[1]])
  expect_true(all(out$token_ids[[2]] == 42L))
  expect_error(generate_parallel(ctx, "Hi", logit_bias = c(100)), "named by token ids")
  expect_error(generate_parallel(ctx, "Hi", logit_bias = c("x" = 1)), "named by token ids")
  expect_error(generate_parallel(ctx, "Hi", logit_bias = c("4294967338" = 1)), "named by token ids")
  out <- generate_parallel(ctx, "Hi", logit_bias = c("99999999" = 1), max_tokens = 2)
  expect_equal(out$finish_reason, "error")
  expect_match(out$error, "logit_bias names token 99999999")
})
