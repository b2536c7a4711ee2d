# Rscript demo.R MODEL.gguf PROMPT... : greedy answers to every prompt in one call.
# Prints, per prompt, a line "TOKENS <ids>" (for comparison with other bindings) and the text.
args <- commandArgs(trailingOnly = TRUE)
if (length(args) < 2) stop("usage: Rscript demo.R MODEL.gguf PROMPT...")
here <- dirname(sub("^--file=", "", grep("^--file=", commandArgs(FALSE), value = TRUE)[1]))
source(file.path(here, "fastpar.R"))
fastpar_load_glue(file.path(here, "fastpar_r.so"))

model <- fastpar_model(args[1])
ctx <- fastpar_context(model, n_parallel = 4, n_ctx_per_seq = 512)
prompts <- args[-1]
results <- generate_parallel(ctx, prompts, max_tokens = 24, temperature = 0)
for (i in seq_along(prompts)) {
  r <- results[[i]]
  cat(sprintf("PROMPT %d %s\n", i, r$finish_reason))
  cat("TOKENS", r$token_ids, "\n")
  cat(r$text, "\n\n")
}
s <- fastpar_last_stats(ctx)
cat(sprintf("fastpar %s: %d prompts, %d generated tokens, %.1f tok/s\n", fastpar_version(),
            as.integer(s$n_prompts), as.integer(s$n_gen_tokens), s$gen_tokens_per_s))
fastpar_free(ctx)
fastpar_free(model)
