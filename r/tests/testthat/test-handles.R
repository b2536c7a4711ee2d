test_that("defaults come from the C library and equal Python's", {
  d <- fastpar_default_params()
  expect_identical(names(d), c("model", "context", "generate"))
  expect_true(is.integer(d$context$n_parallel) && d$context$n_parallel > 0)
  # Python's defaults are its C++ structs' (fastpar._core); R's come through the C ABI.
  code <- paste("import fastpar._core as c",
                "for name, p in (('model', c.ModelParams()), ('context', c.ContextParams()),",
                "                ('generate', c.GenerateParams())):",
                "    for k in dir(p):",
                "        v = getattr(p, k)",
                "        if not k.startswith('_') and isinstance(v, (bool, int, float)):",
                "            print(name, k, float(v))", sep = "\n")
  out <- system2(python(), c("-c", shQuote(code)), stdout = TRUE)
  fields <- do.call(rbind, strsplit(out, " "))
  n_compared <- 0L
  for (i in seq_len(nrow(fields))) {
    got <- d[[fields[i, 1]]][[fields[i, 2]]]
    if (is.null(got)) next  # a Python-only field (top_logprobs)
    expect_equal(as.numeric(got), as.numeric(fields[i, 3]), tolerance = 1e-6, label = fields[i, 2])
    n_compared <- n_compared + 1L
  }
  expect_identical(n_compared, length(unlist(d)))
})

test_that("errors of a call are R conditions with fastpar's message", {
  e <- tryCatch(fastpar_model(file.path(tempdir(), "no-such-model.gguf")), error = function(e) e)
  expect_s3_class(e, "fastpar_error")
  expect_identical(e$status, "not_found")
  expect_match(conditionMessage(e), "not found")
  e <- tryCatch(fastpar_context(test_model(), n_parallel = 0), error = function(e) e)
  expect_s3_class(e, "fastpar_error")
  expect_identical(e$status, "invalid_argument")
  expect_match(conditionMessage(e), "n_parallel")
  ctx <- test_context()
  e <- tryCatch(generate_parallel(ctx, "x", top_k = -3), error = function(e) e)
  expect_s3_class(e, "fastpar_error")
  expect_match(conditionMessage(e), "top_k")
  expect_error(generate_parallel(ctx, "x", n = 0), class = "fastpar_error")
  expect_error(generate_parallel(ctx, "x", json_schema = "{not json"), class = "fastpar_error")
})

test_that("bad arguments are R errors before any work", {
  ctx <- test_context()
  expect_error(fastpar_model(1), "path must be one string")
  expect_error(fastpar_context("model"), "fastpar_model")
  expect_error(fastpar_context(test_model(), n_parallel = 1.5), "whole number")
  expect_error(fastpar_context(test_model(), colour = 1), "unknown context option")
  expect_error(generate_parallel("ctx", "x"), "fastpar_context")
  expect_error(generate_parallel(ctx, 42), "got a numeric vector")
  expect_error(generate_parallel(ctx, list(1, 2)), "prompt 1 is a numeric")
  expect_error(generate_parallel(ctx, c("a", NA)), "NA")
  expect_error(generate_parallel(ctx, list(list(role = "user", content = "hi"))), "is one message")
  expect_error(generate_parallel(ctx, c("a", "b"), max_tokens = c(1, 2, 3)), "length 1 or one value per prompt")
  expect_error(generate_parallel(ctx, "a", temperature = "hot"), "numbers")
  expect_error(generate_parallel(ctx, "a", ignore_eos = NA), "TRUE or FALSE")
  expect_error(generate_parallel(ctx, "a", stop = 3), "stop must be")
  expect_error(generate_parallel(ctx, "a", colour = 1), "unknown option")
})

test_that("fastpar_free frees at once; a freed handle is an R error", {
  test_model()
  model <- fastpar_model(cache$path)
  ctx <- fastpar_context(model, n_parallel = 2, n_ctx_per_seq = 128)
  expect_true(fastpar_free(model))   # the context keeps the model alive
  expect_false(fastpar_free(model))
  expect_output(print(model), "freed")
  res <- generate_parallel(ctx, "The capital of France is", max_tokens = 4, temperature = 0)
  expect_identical(res$n_gen_tokens, 4L)
  expect_true(fastpar_free(ctx))
  expect_error(generate_parallel(ctx, "x"), "freed")
  expect_error(fastpar_context(model), "freed")
  expect_error(fastpar_free(1), "fastpar_model or fastpar_context")
  # Handles left to the garbage collector are freed by their finalizers.
  for (i in 1:3) fastpar_context(fastpar_model(cache$path), n_parallel = 1, n_ctx_per_seq = 64)
  expect_silent(gc())
})

test_that("the package reports the library it uses", {
  info <- fastpar_info()
  expect_true(nzchar(info$version))
  expect_true(info$backend %in% c("cpu", "cuda", "metal"))
  expect_true(file.exists(file.path(info$include, "fastpar.h")))
  expect_true(file.exists(info$library))
})

test_that("the KV cache's types are context options", {
  ctx <- fastpar_context(test_model(), n_parallel = 2, n_ctx_per_seq = 128, type_k = "q8_0", type_v = "q8_0")
  out <- generate_parallel(ctx, c("The capital of France is", "1, 2, 3,"), max_tokens = 4, temperature = 0)
  expect_identical(out$finish_reason, c("length", "length"))
  e <- tryCatch(fastpar_context(test_model(), n_parallel = 1, type_k = "q3"), error = function(e) e)
  expect_s3_class(e, "fastpar_error")
  expect_match(conditionMessage(e), "type_k must be one of", fixed = TRUE)
  expect_error(fastpar_context(test_model(), type_v = 8), "type_v must be one string")
})

test_that("the default model in fastpar's cache is found without Python", {
  folder <- tempfile("fastpar-cache-")
  dir.create(file.path(folder, "models"), recursive = TRUE)
  on.exit(unlink(folder, recursive = TRUE), add = TRUE)
  # No interpreter that could answer: the file must be found by R alone, or refused clearly.
  withr::local_envvar(FASTPAR_CACHE = folder, FASTPAR_PYTHON = file.path(folder, "no-python"))
  expect_error(fastpar_default_model_path(), "failed in .*no-python")
  file <- file.path(folder, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
  writeLines("a stand-in", file)
  expect_equal(normalizePath(fastpar_default_model_path()), normalizePath(file))
})

test_that("R looks for the default model where Python's fastpar keeps it", {
  py <- python()
  cached <- fastpar:::.default_model_in_cache()
  # (tests/test_r_package.py allows no skip: where the suite runs, the model is cached.)
  if (!file.exists(cached)) skip(paste("the default model is not in fastpar's cache:", cached))
  out <- system2(py, c("-c", shQuote("import fastpar; print(fastpar.default_model_path())")), stdout = TRUE)
  expect_equal(normalizePath(cached), normalizePath(out[length(out)]))
})
