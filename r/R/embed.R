#' Embed texts: one vector per text
#'
#' Every text of the call shares the context's batches, as prompts do in
#' [generate_parallel()]; each is decoded whole and pooled into one vector (the pooling the
#' context was made with: `fastpar_context(model, embeddings = TRUE, pooling = ...)`).
#'
#' @param ctx A [fastpar_context()] made with `embeddings = TRUE`.
#' @param texts A character vector.
#' @param normalize `TRUE` (the default) scales every row to unit length.
#' @return A numeric matrix with one row per text, in input order. A text that cannot be
#'   embedded (empty, longer than a batch) fails alone: its row is `NA` and the matrix's
#'   `errors` attribute (a character vector, `NA` where a text did not fail) says why.
#'   Attributes `n_prompt_tokens` (tokens per text) and `stats` (the call's statistics).
#' @examples
#' \donttest{
#' model <- fastpar_model(fastpar_default_model_path())
#' ctx <- fastpar_context(model, n_parallel = 4, embeddings = TRUE)
#' rows <- embed(ctx, c("The capital of France is Paris.", "Dogs are loyal."))
#' dim(rows)
#' }
#' @export
embed <- function(ctx, texts, normalize = TRUE) {
  if (!inherits(ctx, "fastpar_context")) stop("ctx must be a fastpar_context", call. = FALSE)
  if (!is.character(texts) || anyNA(texts)) stop("texts must be a character vector without NA", call. = FALSE)
  normalize <- .lgl1(normalize, "normalize")
  out <- .check(.Call(C_fastpar_r_embed, ctx, enc2utf8(texts), normalize, NULL), sys.call())
  if (is.null(out)) .interrupted(sys.call())
  rows <- out$rows
  attr(rows, "errors") <- out$errors
  attr(rows, "n_prompt_tokens") <- out$n_prompt_tokens
  attr(rows, "stats") <- out$stats
  rows
}

#' Rerank documents: one relevance score per document for a query
#'
#' Scores every (query, document) pair with a reranker model (the bge-reranker kind), the
#' pairs made as llama-server's `/rerank` makes them and sharing the context's batches.
#'
#' @param ctx A [fastpar_context()] of a reranker made with `embeddings = TRUE` (its GGUF
#'   names rank pooling; `pooling = "rank"` otherwise).
#' @param query A string.
#' @param documents A character vector.
#' @return A numeric vector of scores in document order (higher is more relevant), as
#'   Python's `fastpar.rerank`. A pair that cannot be scored (longer than a batch) fails
#'   alone: its score is `NA` and the `errors` attribute (`NA` where a pair did not fail)
#'   says why. Attributes `n_prompt_tokens` and `stats` as for [embed()].
#' @examples
#' \donttest{
#' # needs a reranker GGUF, e.g. bge-reranker-v2-m3 converted by llama.cpp
#' if (file.exists("reranker.gguf")) {
#'   ctx <- fastpar_context(fastpar_model("reranker.gguf"), n_parallel = 4, embeddings = TRUE)
#'   rerank(ctx, "What do pandas eat?", c("Bamboo, mostly.", "Paris is in France."))
#' }
#' }
#' @export
rerank <- function(ctx, query, documents) {
  if (!inherits(ctx, "fastpar_context")) stop("ctx must be a fastpar_context", call. = FALSE)
  if (!is.character(query) || length(query) != 1L || is.na(query)) stop("query must be one string", call. = FALSE)
  if (!is.character(documents) || anyNA(documents)) {
    stop("documents must be a character vector without NA", call. = FALSE)
  }
  out <- .check(.Call(C_fastpar_r_embed, ctx, enc2utf8(documents), FALSE, enc2utf8(query)), sys.call())
  if (is.null(out)) .interrupted(sys.call())
  scores <- if (ncol(out$rows) > 0L) out$rows[, 1L] else rep(NA_real_, length(documents))
  attr(scores, "errors") <- out$errors
  attr(scores, "n_prompt_tokens") <- out$n_prompt_tokens
  attr(scores, "stats") <- out$stats
  scores
}
