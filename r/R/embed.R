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
  out <- .check(.Call(C_fastpar_r_embed, ctx, enc2utf8(texts), normalize), sys.call())
  if (is.null(out)) .interrupted(sys.call())
  rows <- out$rows
  attr(rows, "errors") <- out$errors
  attr(rows, "n_prompt_tokens") <- out$n_prompt_tokens
  attr(rows, "stats") <- out$stats
  rows
}
