#' Run many prompts in one call
#'
#' Every prompt of the call shares one batch; each has its own sequence and sampler, so
#' prompts never see each other's output, and a prompt that cannot be served (too long
#' for the context, ...) fails alone: its row says so while the others complete.
#'
#' Every option is a vector of length 1 (for every prompt) or one value per prompt;
#' `NULL` takes fastpar's default, read from the C library
#' (`fastpar_generate_default_params()`, see [fastpar_default_params()]).
#'
#' @param ctx A [fastpar_context()].
#' @param prompts A character vector of raw-text prompts, or a list whose entries are each
#'   one string or one chat: a list of messages `list(role = , content = )`, or a
#'   data.frame with columns `role` and `content`. A chat is rendered with the model's own
#'   chat template. With `tools`, an assistant's message may hold the calls it made
#'   (`tool_calls`: a data.frame as the `tool_calls` column gives them; no `content` needed)
#'   and a `"tool"` message the `tool_call_id` of the call it answers.
#' @param max_tokens Most new tokens.
#' @param temperature `0` for greedy decoding.
#' @param top_k,top_p,min_p Sampling cut-offs (`0`, `1` and `0` turn them off).
#' @param repeat_penalty Penalty on repeated tokens (`1` is none).
#' @param seed Random seed (`-1`: drawn at random). Sample `j` of a prompt is seeded
#'   `seed + j - 1`.
#' @param stop Stop strings: a character vector for every prompt, or a list with one
#'   character vector per prompt. The text ends before the stop string.
#' @param ignore_eos `TRUE` to go on past the end-of-generation token.
#' @param json_schema A JSON schema as JSON text (for instance from
#'   `jsonlite::toJSON(schema, auto_unbox = TRUE)`): every output is JSON that follows
#'   it. `NA` for a prompt without one.
#' @param n Samples per prompt: the prompt is decoded once, and the result has `n` rows
#'   for it.
#' @param ... Further options by name: `grammar` (GBNF text, `NA` for none; not with
#'   `json_schema`), `choice` (the outputs allowed, each output exactly one of them: a
#'   character vector for every prompt, or a list with one per prompt; not with
#'   `json_schema` or `grammar`), `regex` (a regular expression every output matches whole,
#'   as Python's `re.fullmatch`; a string for every prompt or one per prompt, `NA` for none;
#'   docs/api.md lists the subset), `logit_bias` (a numeric vector named by token ids, added to
#'   those tokens' logits before sampling: `c("42" = 100)` forces token 42, `-Inf` bans a
#'   token; or a list with one such vector per prompt), `allowed_token_ids` (the only token
#'   ids generated: a vector, or a list with one per prompt; the output ends early only if an
#'   end-of-generation token is among them), `reasoning` (`"split"`: a thinking model's
#'   `<think>` thought goes to a `reasoning` column and `text` is the answer after it, which
#'   the constraints apply to; `"off"`: a chat prompt's thought is closed empty), `tools`
#'   (OpenAI's list of functions as JSON text, for chat prompts: the model's template renders
#'   them, and the calls an output makes come back in a `tool_calls` column with
#'   `finish_reason` `"tool_calls"`; not with the constraints above), `tool_choice` (`"auto"`,
#'   the default, `"none"`, `"required"` or a function's name: the last two force a call),
#'   `parallel_tool_calls` (`TRUE` allows several calls), `priority` (which queued prompt takes a free slot first:
#'   the lowest value, first come first served among equals; a more urgent one suspends a
#'   running one, which resumes where it stopped), `logprobs` (`TRUE` adds a list column `logprobs`, the log-probability
#'   of every generated token), `top_logprobs` (`k` from 1 to 20 adds a list column
#'   `top_logprobs`: for each row a list of two matrices with a row per generated token and
#'   its `k` most likely tokens in columns, best first: `token_ids` (integer) and
#'   `logprobs`), `presence_penalty`, `frequency_penalty`, `repeat_last_n`.
#' @return A data.frame with one row per prompt, in input order (with `n` given: one row
#'   per sample, prompt by prompt, with columns `prompt_index` and `sample_index` first):
#'   \describe{
#'   \item{text}{the generated text (UTF-8)}
#'   \item{finish_reason}{`"stop"` (end of generation or a stop string), `"length"`
#'     (`max_tokens` reached or the context full), `"tool_calls"` (the output made tool
#'     calls), `"error"` (this prompt failed)}
#'   \item{error}{why the prompt failed, `NA` unless `finish_reason` is `"error"`}
#'   \item{n_prompt_tokens}{prompt tokens decoded for this prompt}
#'   \item{n_prompt_tokens_shared}{prompt tokens copied from another prompt's cache}
#'   \item{n_prompt_tokens_cached}{prompt tokens an earlier prompt left in the prefix cache}
#'   \item{n_gen_tokens}{tokens generated}
#'   \item{token_ids}{a list column: the generated token ids}
#'   \item{tool_calls}{with `tools`: a list column, for each row a data.frame of the calls
#'     its output made (columns `id`, `name`, `arguments`, the last a JSON object as text)}
#'   }
#'   and the call's statistics as `attr(res, "stats")` (see [fastpar_last_stats()]).
#'
#'   An error of the call itself (a bad argument, an option out of range, a freed
#'   context, a chat prompt for a model without a chat template) is an R error of class
#'   `fastpar_error`. Interrupting the call (Ctrl-C) cancels every prompt, leaves the
#'   context clean and signals a condition of class `c("fastpar_interrupt", "interrupt")`.
#' @examples
#' \donttest{
#' model <- fastpar_model(fastpar_default_model_path())
#' ctx <- fastpar_context(model, n_parallel = 4, n_ctx_per_seq = 512)
#' res <- generate_parallel(ctx, c("The capital of France is", "Water boils at"),
#'                          max_tokens = 16, temperature = 0)
#' res[, c("text", "finish_reason", "n_gen_tokens")]
#' attr(res, "stats")$gen_tokens_per_s
#'
#' chat <- list(list(role = "user", content = "Name a colour."))
#' generate_parallel(ctx, list(chat), max_tokens = 8, n = 2, temperature = 0.8, seed = 1)$text
#'
#' schema <- '{"type": "object", "required": ["city"],
#'             "properties": {"city": {"type": "string", "maxLength": 20}}}'
#' generate_parallel(ctx, "Paris hosted the 1924 Olympics. As JSON:", json_schema = schema,
#'                   temperature = 0, max_tokens = 32)$text
#' }
#' @export
generate_parallel <- function(ctx, prompts, max_tokens = NULL, temperature = NULL, top_k = NULL, top_p = NULL,
                              min_p = NULL, repeat_penalty = NULL, seed = NULL, stop = NULL, ignore_eos = NULL,
                              json_schema = NULL, n = NULL, ...) {
  call <- sys.call()
  if (!inherits(ctx, "fastpar_context")) stop("ctx must be a fastpar_context", call. = FALSE)
  prompts <- .prompts(prompts)
  k <- length(prompts)
  extra <- list(...)
  known <- .extra_options$generate
  if (length(extra) && (is.null(names(extra)) || any(names(extra) == "") || !all(names(extra) %in% known))) {
    stop("unknown option(s) in ...: ", paste(setdiff(names(extra), known), collapse = ", "),
         "; known: ", paste(known, collapse = ", "), call. = FALSE)
  }
  # Every option by name, checked and coerced to its kind's R type: the numbers and
  # logicals in the C library's order, as its defaults say, then the strings.
  given <- c(mget(setdiff(.options("generate"), .extra_options$generate), envir = environment()), extra)
  defaults <- .Call(C_fastpar_r_default_params)$generate
  opts <- list()
  for (name in c(names(defaults), setdiff(.options("generate"), names(defaults)))) {
    opts[name] <- list(if (name %in% c("stop", "choice")) .strings(given[[name]], k, name) else
      if (name == "logit_bias") .biases(given[[name]], k) else
      if (name == "allowed_token_ids") .tokens(given[[name]], k, name) else
      .per_prompt(given[[name]], name, k, .kind(name, defaults[[name]])))
  }
  opts <- opts[!vapply(opts, is.null, TRUE)]
  per_prompt <- any(lengths(opts) > 1)
  out <- .Call(C_fastpar_r_generate, ctx, prompts, opts, per_prompt)
  if (is.null(out)) .interrupted(call)
  out <- .check(out, call)
  cols <- out$columns
  if (is.null(n)) cols$prompt_index <- cols$sample_index <- NULL
  if (is.null(cols$logprobs)) cols$logprobs <- NULL
  if (is.null(cols$reasoning)) cols$reasoning <- NULL
  if (is.null(cols$tool_calls)) cols$tool_calls <- NULL
  if (is.null(cols$top_logprobs)) cols$top_logprobs <- NULL
  res <- structure(cols, class = "data.frame", row.names = seq_along(cols$text))
  attr(res, "stats") <- out$stats
  res
}

# The options each function passes to the C library besides its named arguments: those it
# takes in `...`. .options() lists all of a function's options; tests/test_fields.py checks
# them against the options fastpar_fields.h gives R.
.extra_options <- list(
  model = character(),
  context = c("n_batch", "device_sampling", "warmup", "kv_unified", "share_prefixes", "type_k", "type_v",
              "prefix_cache_mib", "prefix_cache_dir", "embeddings", "pooling"),
  generate = c("grammar", "choice", "logit_bias", "allowed_token_ids", "priority", "regex", "reasoning", "tools",
               "tool_choice", "parallel_tool_calls", "logprobs", "top_logprobs", "presence_penalty",
               "frequency_penalty", "repeat_last_n")
)

.options <- function(what) {
  f <- switch(what, model = fastpar_model, context = fastpar_context, generate = generate_parallel)
  c(setdiff(names(formals(f)), c("path", "model", "ctx", "prompts", "...")), .extra_options[[what]])
}

# The call was interrupted: fastpar cancelled it and cleared the context. Signal the
# interrupt as R does (handlers for "interrupt" see it); unhandled, return to the top level.
.interrupted <- function(call) {
  cond <- structure(class = c("fastpar_interrupt", "interrupt", "condition"),
                    list(message = "generation interrupted", call = call))
  signalCondition(cond)
  invokeRestart("abort")
}

# A list with one entry per prompt: a string, or list(roles, contents) for a chat.
.prompts <- function(prompts) {
  bad <- function(what) stop("prompts must be a character vector, or a list of strings and chats; ", what,
                             call. = FALSE)
  if (is.character(prompts)) {
    if (anyNA(prompts)) bad("a prompt is NA")
    return(as.list(unname(prompts)))
  }
  if (!is.list(prompts) || is.data.frame(prompts)) {
    bad(paste("got", if (is.data.frame(prompts)) "a data.frame (wrap one chat in list())" else
      paste("a", class(prompts)[1], "vector")))
  }
  lapply(seq_along(prompts), function(i) {
    p <- prompts[[i]]
    if (is.character(p) && length(p) == 1 && !is.na(p)) return(p)
    if (is.data.frame(p)) {
      if (!all(c("role", "content") %in% names(p))) bad(sprintf("chat %d has no role and content columns", i))
      roles <- p$role
      contents <- p$content
    } else if (is.list(p) && length(p) > 0) {
      if (!is.null(names(p)) && all(c("role", "content") %in% names(p))) {
        bad(sprintf("prompt %d is one message; a chat is a list of messages: list(list(role = , content = ))", i))
      }
      ok <- vapply(p, function(m) is.list(m) && "role" %in% names(m) &&
                     ("content" %in% names(m) || !is.null(m$tool_calls)), TRUE)
      if (!all(ok)) bad(sprintf("prompt %d: every message of a chat is list(role = , content = )", i))
      one <- function(x) is.character(x) && length(x) == 1
      roles <- lapply(p, `[[`, "role")
      # An assistant's message with tool_calls may have no content (NA).
      contents <- lapply(p, function(m) if (is.null(m$content) && !is.null(m$tool_calls)) NA_character_ else m$content)
      if (!all(vapply(roles, one, TRUE)) || !all(vapply(contents, one, TRUE))) {
        bad(sprintf("prompt %d: a message's role and content are single strings", i))
      }
      calls <- lapply(seq_along(p), function(j) .message_calls(p[[j]]$tool_calls, i, j, bad))
      ids <- vapply(p, function(m) {
        if (is.null(m$tool_call_id)) return(NA_character_)
        if (!one(m$tool_call_id) || is.na(m$tool_call_id)) bad(sprintf("prompt %d: a tool_call_id is one string", i))
        m$tool_call_id
      }, "")
      roles <- unlist(roles)
      contents <- unlist(contents)
      if (anyNA(contents[vapply(calls, is.null, TRUE)])) {
        bad(sprintf("chat %d: a message without tool_calls has no content", i))
      }
      if (any(!vapply(calls, is.null, TRUE)) || !all(is.na(ids))) {
        if (anyNA(roles)) bad(sprintf("chat %d: roles are strings, not NA", i))
        return(list(roles, contents, ids, calls))
      }
    } else {
      bad(sprintf("prompt %d is %s", i, if (is.character(p)) "not one string" else paste("a", class(p)[1])))
    }
    if (!is.character(roles) || !is.character(contents) || anyNA(roles) || anyNA(contents) || !length(roles)) {
      bad(sprintf("chat %d: roles and contents are strings, not NA", i))
    }
    list(roles, contents)
  })
}

# An earlier assistant turn's tool calls (a data.frame with columns id, name and arguments,
# as the tool_calls column gives them), as three character vectors; NULL for none.
.message_calls <- function(calls, i, j, bad) {
  if (is.null(calls)) return(NULL)
  if (!is.data.frame(calls) || !all(c("id", "name", "arguments") %in% names(calls)) ||
      !all(vapply(calls[c("id", "name", "arguments")], is.character, TRUE)) ||
      anyNA(calls$name) || anyNA(calls$arguments)) {
    bad(sprintf("prompt %d, message %d: tool_calls is a data.frame with character columns id, name and arguments", i, j))
  }
  list(calls$id, calls$name, calls$arguments)
}

# The R type an option is checked as: from its default, or text for one without (json_schema,
# grammar); a seed is a whole number that may not fit an integer.
.kind <- function(name, default) {
  if (name == "seed") return("seed")
  if (is.null(default)) return("chr")
  if (is.logical(default)) "lgl" else if (is.integer(default)) "int" else "num"
}

# An option of length 1 or one value per prompt, coerced to the type the C glue reads.
.per_prompt <- function(x, what, k, type) {
  if (is.null(x)) return(NULL)
  if (length(x) != 1 && length(x) != k) {
    stop(what, " must have length 1 or one value per prompt (", k, "), got ", length(x), call. = FALSE)
  }
  ok <- switch(type,
    int = is.numeric(x) && !anyNA(x) && all(x == round(x)) && all(abs(x) <= .Machine$integer.max),
    seed = is.numeric(x) && !anyNA(x) && all(x == round(x)),
    num = is.numeric(x) && !anyNA(x),
    lgl = is.logical(x) && !anyNA(x),
    chr = is.character(x))
  if (!ok) {
    stop(what, switch(type, int = " must be whole numbers", seed = " must be whole numbers",
                      num = " must be numbers", lgl = " must be TRUE or FALSE",
                      chr = " must be a character vector (NA for none)"), call. = FALSE)
  }
  switch(type, int = as.integer(x), seed = as.double(x), num = as.double(x), lgl = x, chr = enc2utf8(unname(x)))
}

# Stop strings or choices: a character vector for all prompts, or a list with one per prompt.
.strings <- function(x, k, what) {
  if (is.null(x)) return(NULL)
  if (is.character(x)) x <- list(x)
  if (!is.list(x) || !all(vapply(x, function(s) is.character(s) && !anyNA(s), TRUE))) {
    stop(what, " must be a character vector, or a list of character vectors (one per prompt)", call. = FALSE)
  }
  if (length(x) != 1 && length(x) != k) {
    stop(what, " must be one character vector or one per prompt (", k, "), got ", length(x), call. = FALSE)
  }
  x
}

# Token ids: a vector of whole numbers for all prompts, or a list with one per prompt.
.tokens <- function(x, k, what) {
  if (is.null(x)) return(NULL)
  if (!is.list(x)) x <- list(x)
  ok <- function(t) is.numeric(t) && length(t) > 0 && !anyNA(t) && all(t == round(t)) && all(t >= 0 & t < 2^31)
  if (!all(vapply(x, ok, TRUE))) {
    stop(what, " must be a vector of token ids (whole numbers >= 0), or a list of them (one per prompt)",
         call. = FALSE)
  }
  if (length(x) != 1 && length(x) != k) {
    stop(what, " must be one vector or one per prompt (", k, "), got ", length(x), call. = FALSE)
  }
  lapply(x, as.integer)
}

# Logit biases: a numeric vector named by token ids for all prompts, or a list with one per
# prompt; the C glue reads each name as the token id.
.biases <- function(x, k) {
  if (is.null(x)) return(NULL)
  if (!is.list(x)) x <- list(x)
  ok <- function(b) is.numeric(b) && !anyNA(b) && all(b < Inf) && !is.null(names(b)) &&
    all(grepl("^[0-9]{1,10}$", names(b))) && all(as.numeric(names(b)) < 2^31)
  if (!all(vapply(x, ok, TRUE))) {
    stop("logit_bias must be a numeric vector named by token ids (e.g. c(\"42\" = 100); -Inf bans), ",
         "or a list of them (one per prompt)", call. = FALSE)
  }
  if (length(x) != 1 && length(x) != k) {
    stop("logit_bias must be one vector or one per prompt (", k, "), got ", length(x), call. = FALSE)
  }
  lapply(x, function(b) stats::setNames(as.double(b), names(b)))
}
