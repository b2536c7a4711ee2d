#' fastpar: many prompts through one llama.cpp model at once
#'
#' Load a GGUF model with [fastpar_model()], make a context with [fastpar_context()] and
#' run prompts with [generate_parallel()]: every prompt of a call shares one batch, each
#' prompt has its own sequence and sampler, and a prompt that fails fails alone.
#'
#' The package calls fastpar's C interface (`fastpar.h`, `libfastpar`), found when the
#' package is installed: in `FASTPAR_HOME`, or in the installed Python package `fastpar`
#' (see [fastpar_info()]).
#'
#' Errors of a call (a missing model file, an option out of range, a freed handle) are
#' conditions of class `fastpar_error` carrying fastpar's message and a `status`
#' (`"invalid_argument"`, `"not_found"`, `"model_load"`, `"runtime"`,
#' `"out_of_memory"`). Interrupting a call (Ctrl-C) cancels it, leaves the context clean
#' and signals a condition of class `c("fastpar_interrupt", "interrupt")`.
#' @keywords internal
#' @useDynLib fastpar, .registration = TRUE, .fixes = "C_"
"_PACKAGE"

# Turns a "fastpar_failure" returned by the C glue into an R error of class fastpar_error.
.check <- function(x, call) {
  if (inherits(x, "fastpar_failure")) {
    stop(structure(class = c("fastpar_error", "error", "condition"),
                   list(message = x$message, call = call, status = x$status)))
  }
  x
}

# One whole number (or NULL), as an integer.
.int1 <- function(x, what, null_ok = TRUE) {
  if (is.null(x) && null_ok) return(NULL)
  if (!is.numeric(x) || length(x) != 1 || is.na(x) || x != round(x) || abs(x) > .Machine$integer.max) {
    stop(what, " must be one whole number", call. = FALSE)
  }
  as.integer(x)
}

# One string (or NULL), in UTF-8; the C library checks its value.
.chr1 <- function(x, what) {
  if (is.null(x)) return(NULL)
  if (!is.character(x) || length(x) != 1 || is.na(x)) stop(what, " must be one string", call. = FALSE)
  enc2utf8(x)
}

.lgl1 <- function(x, what) {
  if (is.null(x)) return(NULL)
  if (!is.logical(x) || length(x) != 1 || is.na(x)) stop(what, " must be TRUE or FALSE", call. = FALSE)
  x
}

#' Load a GGUF model
#'
#' @param path Path of a GGUF file.
#' @param n_gpu_layers Layers to put on the GPU: `-1` for all (a GPU build of fastpar),
#'   `NULL` for fastpar's default (see [fastpar_default_params()]).
#' @param use_mmap `TRUE` maps the file instead of reading it into memory; `NULL` for
#'   fastpar's default.
#' @return A `fastpar_model`, freed by the garbage collector or by [fastpar_free()].
#' @seealso [fastpar_context()], [fastpar_default_model_path()]
#' @examples
#' \donttest{
#' model <- fastpar_model(fastpar_default_model_path())
#' model
#' fastpar_free(model)
#' }
#' @export
fastpar_model <- function(path, n_gpu_layers = NULL, use_mmap = NULL) {
  if (!is.character(path) || length(path) != 1 || is.na(path)) stop("path must be one string", call. = FALSE)
  opts <- list(n_gpu_layers = .int1(n_gpu_layers, "n_gpu_layers"), use_mmap = .lgl1(use_mmap, "use_mmap"))
  m <- .check(.Call(C_fastpar_r_model_load, path.expand(path), opts[!vapply(opts, is.null, TRUE)]), sys.call())
  structure(m, class = "fastpar_model", path = path)
}

#' Make a context: slots for prompts decoded together
#'
#' @param model A [fastpar_model()].
#' @param n_parallel Slots: prompts decoded together (1 to 256).
#' @param n_ctx_per_seq Positions one prompt plus its output may use.
#' @param n_threads CPU threads; `0` for one per CPU this process may use.
#' @param ... Further context options of fastpar by name: `n_batch`, `kv_unified`,
#'   `device_sampling`, `share_prefixes`, `warmup`, and the KV cache's types `type_k` and
#'   `type_v` (`"f16"`, the default, `"bf16"`, `"f32"`, `"q8_0"` or `"q4_0"`: `"q8_0"` holds
#'   about 1.9x the positions in the same memory), and `prefix_cache_mib` (the prefix cache's
#'   host memory in MiB: `-1` sizes it from the free memory; `0`, the default, turns the
#'   cache off) and `prefix_cache_dir` (a folder keeping it across restarts), and
#'   `embeddings = TRUE` for a context that [embed()]s instead of generating, pooling by
#'   `pooling` (`"mean"`, `"cls"` or `"last"`; `NULL` for the model's own) (docs/api.md of fastpar).
#' @details Every option left `NULL` takes fastpar's own default, read from the C library
#'   (`fastpar_context_default_params()`; see [fastpar_default_params()]). The context
#'   keeps its model alive.
#' @return A `fastpar_context`, freed by the garbage collector or by [fastpar_free()].
#' @examples
#' \donttest{
#' model <- fastpar_model(fastpar_default_model_path())
#' ctx <- fastpar_context(model, n_parallel = 4, n_ctx_per_seq = 512)
#' ctx
#' }
#' @export
fastpar_context <- function(model, n_parallel = NULL, n_ctx_per_seq = NULL, n_threads = NULL, ...) {
  if (!inherits(model, "fastpar_model")) stop("model must be a fastpar_model", call. = FALSE)
  extra <- list(...)
  known <- .extra_options$context
  unknown <- setdiff(names(extra), known)
  if (length(extra) && (is.null(names(extra)) || any(names(extra) == "") || length(unknown))) {
    stop("unknown context option(s): ", paste(unknown, collapse = ", "), "; known: ",
         paste(known, collapse = ", "), call. = FALSE)
  }
  opts <- list(n_parallel = .int1(n_parallel, "n_parallel"), n_ctx_per_seq = .int1(n_ctx_per_seq, "n_ctx_per_seq"),
               n_threads = .int1(n_threads, "n_threads"))
  defaults <- .Call(C_fastpar_r_default_params)$context
  for (name in names(extra)) {
    opts[[name]] <- if (is.null(defaults[[name]])) .chr1(extra[[name]], name) else
      if (is.logical(defaults[[name]])) .lgl1(extra[[name]], name) else .int1(extra[[name]], name)
  }
  ctx <- .check(.Call(C_fastpar_r_context_new, model, opts[!vapply(opts, is.null, TRUE)]), sys.call())
  structure(ctx, class = "fastpar_context")
}

#' Free a model or context now
#'
#' Frees it at once rather than at garbage collection; using it afterwards is an error.
#' A context keeps its model alive, so freeing a model while its contexts exist is safe.
#' @param handle A [fastpar_model()] or [fastpar_context()].
#' @return `TRUE` if it was freed now, `FALSE` if it was freed already (invisibly).
#' @export
fastpar_free <- function(handle) {
  if (!inherits(handle, c("fastpar_model", "fastpar_context"))) {
    stop("handle must be a fastpar_model or fastpar_context", call. = FALSE)
  }
  invisible(.Call(C_fastpar_r_free, handle))
}

#' @export
print.fastpar_model <- function(x, ...) {
  cat("<fastpar_model ", attr(x, "path"), if (!.Call(C_fastpar_r_is_live, x)) " (freed)", ">\n", sep = "")
  invisible(x)
}

#' @export
print.fastpar_context <- function(x, ...) {
  cat("<fastpar_context", if (!.Call(C_fastpar_r_is_live, x)) " (freed)", ">\n", sep = "")
  invisible(x)
}

#' Statistics of a context's last call
#'
#' @param ctx A [fastpar_context()].
#' @return A named list: `n_prompts`, `n_failed`, `n_prompt_tokens`,
#'   `n_prompt_tokens_shared`, `n_prompt_tokens_cached`, `n_gen_tokens`, times in milliseconds (`t_prompt_ms`,
#'   `t_gen_ms`, `t_wall_ms`, `t_sample_ms`), speeds (`prompt_tokens_per_s`,
#'   `gen_tokens_per_s`, `total_tokens_per_s`), `n_decode_calls`, `n_kv_full_retries`,
#'   `n_device_sampled`, `n_padding_tokens`. [generate_parallel()] attaches the same list
#'   to its result as `attr(res, "stats")`.
#' @export
fastpar_last_stats <- function(ctx) {
  if (!inherits(ctx, "fastpar_context")) stop("ctx must be a fastpar_context", call. = FALSE)
  .check(.Call(C_fastpar_r_last_stats, ctx), sys.call())
}

#' fastpar's default options
#'
#' The defaults of the C library (`fastpar_model_default_params()`,
#' `fastpar_context_default_params()`, `fastpar_generate_default_params()`), the ones
#' every option left `NULL` takes. The R package never repeats them.
#' @return A list with entries `model`, `context` and `generate`, each a named list.
#' @examples
#' fastpar_default_params()$generate$max_tokens
#' @export
fastpar_default_params <- function() .Call(C_fastpar_r_default_params)

#' Which fastpar library the package uses
#'
#' @return A list: `version` and `backend` (`"cpu"`, `"cuda"` or `"metal"`) of the
#'   loaded `libfastpar`; `include` and `library`, where the package found `fastpar.h` and
#'   `libfastpar` when it was installed (the package's own `include` and `lib` folders
#'   when it built them from source); `python`, the Python interpreter with the
#'   `fastpar` package found then (`""` if none).
#' @examples
#' fastpar_info()$version
#' @export
fastpar_info <- function() {
  info <- .Call(C_fastpar_r_info)
  if (!nzchar(info$library)) {
    # Built from source at installation: libfastpar and fastpar.h are the package's own.
    info$include <- system.file("include", package = "fastpar")
    info$library <- Sys.glob(file.path(system.file("lib", package = "fastpar"), "libfastpar.*"))[1]
  }
  info
}

# The Python interpreter to ask: $FASTPAR_PYTHON, else the one found at installation.
.python <- function() {
  python <- Sys.getenv("FASTPAR_PYTHON")
  if (nzchar(python)) python else fastpar_info()$python
}

#' Path of fastpar's default model
#'
#' The same file Python's `fastpar.default_model_path()` gives: SmolLM2-135M-Instruct
#' (Q4_1) in fastpar's cache (`$FASTPAR_CACHE`, default `~/.cache/fastpar`), in its
#' `models` folder. A file there is used as it is, without Python: fastpar's fetch
#' verifies the checksums before it moves a file into place. When it is not there yet,
#' the Python package fetches and verifies it (about 100 MB), so that the pinned
#' download and its checksums have one source.
#'
#' The Python interpreter is `$FASTPAR_PYTHON`, else the one that had the `fastpar`
#' package when this package was installed ([fastpar_info()]`$python`).
#' @return The path, one string. An error when the file is not in the cache and no
#'   Python with fastpar is known, or the model cannot be fetched.
#' @examples
#' \donttest{
#' fastpar_default_model_path()
#' }
#' @export
fastpar_default_model_path <- function() {
  cached <- .default_model_in_cache()
  if (file.exists(cached)) {
    return(cached)
  }
  python <- .python()
  if (!nzchar(python)) {
    stop("the default model is not in fastpar's cache (", cached, ") and no Python with the fastpar ",
         "package is known to fetch it: set FASTPAR_PYTHON, or give a model's path", call. = FALSE)
  }
  # An interpreter that cannot be run at all is an error of system2's own: the same message.
  out <- tryCatch(suppressWarnings(system2(python, c("-c", shQuote("import fastpar; print(fastpar.default_model_path())")),
                                           stdout = TRUE, stderr = TRUE)),
                  error = function(e) structure(conditionMessage(e), status = 127L))
  status <- attr(out, "status")
  path <- if (length(out)) out[length(out)] else ""
  if (!is.null(status) && status != 0 || !file.exists(path)) {
    stop("fastpar.default_model_path() failed in ", python, ":\n", paste(out, collapse = "\n"), call. = FALSE)
  }
  path
}

# Where Python's fastpar keeps the default model (fastpar/_fetch.py cache_dir(),
# fastpar/_models.py): $FASTPAR_CACHE or ~/.cache/fastpar, then models/<file>.
.default_model_in_cache <- function() {
  cache <- Sys.getenv("FASTPAR_CACHE")
  if (!nzchar(cache)) cache <- file.path(path.expand("~"), ".cache", "fastpar")
  file.path(cache, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
}
