# Shared by the tests: the model (loaded once), and Python's fastpar for comparisons.
#
# The model is $FASTPAR_TEST_MODEL, else fastpar's default model (asked of the Python
# package, as Python's tests do). Without either, the tests that need it are skipped.

cache <- new.env()

test_model <- function() {
  if (is.null(cache$model)) {
    path <- Sys.getenv("FASTPAR_TEST_MODEL")
    if (!nzchar(path)) {
      path <- tryCatch(fastpar_default_model_path(), error = function(e) NULL)
    }
    if (is.null(path) || !file.exists(path)) skip("no model: set FASTPAR_TEST_MODEL or FASTPAR_PYTHON")
    cache$path <- path
    cache$model <- fastpar_model(path)
  }
  cache$model
}

# A reranker GGUF (a BERT-kind model with bge-reranker's head, random weights): the file
# $FASTPAR_TEST_RERANKER names (tests/test_r_package.py makes one), else one made here with
# fastpar's tests/embedding_models.py when this runs from fastpar's source tree.
test_reranker <- function() {
  if (is.null(cache$reranker)) {
    path <- Sys.getenv("FASTPAR_TEST_RERANKER")
    if (!nzchar(path) || !file.exists(path)) {
      repo_tests <- normalizePath(file.path(test_path(), "..", "..", "..", "tests"), mustWork = FALSE)
      if (!file.exists(file.path(repo_tests, "embedding_models.py"))) {
        skip("no reranker: set FASTPAR_TEST_RERANKER, or run from fastpar's source tree")
      }
      path <- file.path(tempdir(), "fastpar-test-reranker.gguf")
      make <- paste("import pathlib, sys", "sys.path.insert(0, sys.argv[1])",
                    "from embedding_models import make_bert", "make_bert(pathlib.Path(sys.argv[2]), pooling='rank')",
                    sep = "\n")
      system2(python(), c("-c", shQuote(make), shQuote(repo_tests), shQuote(path)))
    }
    cache$reranker <- path
  }
  cache$reranker
}

test_context <- function(n_parallel = 4, n_ctx_per_seq = 512) {
  key <- paste("ctx", n_parallel, n_ctx_per_seq)
  if (is.null(cache[[key]])) cache[[key]] <- fastpar_context(test_model(), n_parallel, n_ctx_per_seq)
  cache[[key]]
}

# The Python the tests compare with: $FASTPAR_TEST_PYTHON (the tests alone use it: a check of
# a package built without Python gives it), else the package's own.
python <- function() {
  p <- Sys.getenv("FASTPAR_TEST_PYTHON")
  if (!nzchar(p)) p <- Sys.getenv("FASTPAR_PYTHON")
  if (!nzchar(p)) p <- fastpar_info()$python
  if (!nzchar(p)) skip("no Python with fastpar (set FASTPAR_PYTHON)")
  p
}

# Runs python_greedy.py: one line of token ids per result of Python's generate_parallel.
# A prompt given as list(chat = "...") is one user message.
python_tokens <- function(prompts, max_tokens, n_parallel = 4, n_ctx_per_seq = 512, tools = NULL) {
  test_model()
  args <- vapply(prompts, function(p) if (is.list(p)) paste0("chat:", p$chat) else paste0("text:", p), "")
  if (!is.null(tools)) args <- c(paste0("--tools=", tools), args)
  script <- test_path("python_greedy.py")
  out <- system2(python(), shQuote(c(script, cache$path, max_tokens, n_parallel, n_ctx_per_seq, args)),
                 stdout = TRUE, stderr = TRUE)
  if (!is.null(attr(out, "status"))) stop("python_greedy.py failed:\n", paste(out, collapse = "\n"))
  lines <- grep("^TOKENS", out, value = TRUE)
  lapply(strsplit(sub("^TOKENS ?", "", lines), " "), function(x) as.integer(x[nzchar(x)]))
}
