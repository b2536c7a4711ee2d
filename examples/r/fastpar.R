# fastpar from R: a thin wrapper over the C glue in fastpar_r.c (built with R CMD SHLIB,
# see README.md). Options left NULL take fastpar's own defaults, read from
# fastpar_*_default_params() in C: R never retypes a default.

# Loads the glue library built from fastpar_r.c (it finds libfastpar through its rpath).
fastpar_load_glue <- function(path) {
  if (!file.exists(path)) stop("fastpar glue not built: ", path, " (see examples/r/README.md)")
  dyn.load(path)
  invisible(path)
}

fastpar_version <- function() .Call("fastpar_r_version")

# A GGUF model. n_gpu_layers: -1 for all (GPU builds only).
fastpar_model <- function(path, n_gpu_layers = NULL) {
  .Call("fastpar_r_model_load", path.expand(path), n_gpu_layers)
}

# A context with n_parallel slots; n_ctx_per_seq positions for one prompt plus its output.
fastpar_context <- function(model, n_parallel = NULL, n_ctx_per_seq = NULL, n_threads = NULL) {
  .Call("fastpar_r_context_new", model, n_parallel, n_ctx_per_seq, n_threads)
}

# Every prompt in one call (one unified batch); a list with one entry per prompt:
# text, token_ids, finish_reason ("stop", "length", "error", "cancelled"), error (NA
# unless finish_reason is "error"), n_prompt_tokens, n_gen_tokens. A prompt that fails
# does not fail the others; a failure of the whole call is an R error.
generate_parallel <- function(context, prompts, max_tokens = NULL, temperature = NULL, top_k = NULL,
                              top_p = NULL, min_p = NULL, repeat_penalty = NULL, seed = NULL,
                              stop = NULL, ignore_eos = NULL) {
  .Call("fastpar_r_generate", context, .strings(prompts, "prompts"), max_tokens, temperature, top_k, top_p,
        min_p, repeat_penalty, seed, if (is.null(stop)) NULL else .strings(stop, "stop"), ignore_eos)
}

# A character vector, or a list of single strings, as a character vector. Anything else
# is an error, as in Python: as.character() would silently turn list(1, 2) into "1", "2".
.strings <- function(x, what) {
  if (is.list(x) && all(vapply(x, function(e) is.character(e) && length(e) == 1, logical(1)))) {
    x <- unlist(x, use.names = FALSE)
    if (is.null(x)) x <- character(0)
  }
  if (!is.character(x)) {
    stop(what, " must be a character vector (or a list of strings), got ",
         if (is.list(x)) "a list holding other values" else paste("a", class(x)[1], "vector"), call. = FALSE)
  }
  x
}

# Statistics of the context's last call.
fastpar_last_stats <- function(context) .Call("fastpar_r_last_stats", context)

# Frees a model or context now rather than at garbage collection (using it after is an error).
fastpar_free <- function(handle) invisible(.Call("fastpar_r_free", handle))
