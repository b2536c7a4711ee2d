test_that("embed gives one unit-length row per text, and equals Python's fastpar.embed", {
  ctx <- fastpar_context(test_model(), n_parallel = 4, embeddings = TRUE, pooling = "mean")
  texts <- c("The capital of France is Paris.", "Dogs are loyal animals.", "import numpy as np")
  rows <- embed(ctx, texts)
  expect_true(is.matrix(rows) && is.double(rows))
  expect_identical(nrow(rows), 3L)
  expect_equal(sqrt(rowSums(rows^2)), rep(1, 3), tolerance = 1e-5)
  expect_true(all(is.na(attr(rows, "errors"))))
  expect_true(all(attr(rows, "n_prompt_tokens") > 0))
  expect_identical(attr(rows, "stats")$n_prompts, 3)
  raw <- embed(ctx, texts[1], normalize = FALSE)
  expect_gt(abs(sqrt(sum(raw^2)) - 1), 1e-3)
  # The same texts, context options and batches from Python: the same vectors.
  code <- paste("import fastpar, sys",
                "m = fastpar.Model(sys.argv[1])",
                "ctx = fastpar.Context(m, n_parallel=4, embeddings=True, pooling='mean')",
                "rows = fastpar.embed(ctx, sys.argv[2:])",
                "print(' '.join('%.9g' % v for v in rows[:, :8].ravel()))", sep = "\n")
  out <- system2(python(), c("-c", shQuote(code), shQuote(cache$path), shQuote(texts)), stdout = TRUE)
  py <- matrix(as.numeric(strsplit(out[length(out)], " ")[[1]]), nrow = 3, byrow = TRUE)
  expect_equal(unname(rows[, 1:8]), py, tolerance = 1e-6)
})

test_that("a text that cannot be embedded fails alone, and contexts are made for one job", {
  ctx <- fastpar_context(test_model(), n_parallel = 4, embeddings = TRUE)
  rows <- embed(ctx, c("A fine sentence.", "", "Another one."))
  expect_true(all(is.na(rows[2, ])))
  expect_true(all(is.finite(rows[c(1, 3), ])))
  errors <- attr(rows, "errors")
  expect_true(is.na(errors[1]) && is.na(errors[3]))
  expect_match(errors[2], "empty")
  # One bad text among 100 fails alone.
  hundred <- sprintf("Sentence number %d is about the sea.", 1:100)
  hundred[42] <- ""
  rows <- embed(ctx, hundred)
  errors <- attr(rows, "errors")
  expect_true(all(is.na(rows[42, ])) && all(is.finite(rows[-42, ])))
  expect_match(errors[42], "empty")
  expect_true(all(is.na(errors[-42])))
  e <- tryCatch(embed(test_context(), "Hello"), error = function(e) e)
  expect_s3_class(e, "fastpar_error")
  expect_match(conditionMessage(e), "made for generation")
  e <- tryCatch(generate_parallel(ctx, "Hello", max_tokens = 2), error = function(e) e)
  expect_match(conditionMessage(e), "made for embeddings")
  expect_error(fastpar_context(test_model(), embeddings = TRUE, pooling = "max"), "pooling must be one of")
})

test_that("rerank scores every document as Python's fastpar.rerank does, a bad pair alone", {
  path <- test_reranker()
  ctx <- fastpar_context(fastpar_model(path), n_parallel = 4, embeddings = TRUE)
  query <- "What do pandas eat?"
  docs <- c("Pandas eat bamboo.", "Paris is in France.", strrep("w ", 700), "Bamboo grows fast.")
  scores <- rerank(ctx, query, docs)
  expect_true(is.double(scores) && length(scores) == 4L)
  errors <- attr(scores, "errors")
  expect_true(is.na(scores[3]) && all(is.finite(scores[-3])))
  expect_match(errors[3], "tokens")
  expect_true(all(is.na(errors[-3])))
  code <- paste("import fastpar, sys",
                "ctx = fastpar.Context(fastpar.Model(sys.argv[1]), n_parallel=4, embeddings=True)",
                "print(' '.join('%.9g' % v for v in fastpar.rerank(ctx, sys.argv[2], sys.argv[3:])))", sep = "\n")
  out <- system2(python(), c("-c", shQuote(code), shQuote(path), shQuote(query), shQuote(docs)), stdout = TRUE)
  py <- as.numeric(strsplit(out[length(out)], " ")[[1]])
  expect_equal(scores[-3], py[-3], tolerance = 1e-6)
  e <- tryCatch(rerank(test_context(), query, docs), error = function(e) e)
  expect_match(conditionMessage(e), "does not rerank")
})
