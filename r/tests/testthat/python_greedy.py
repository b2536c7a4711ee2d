"""python_greedy.py MODEL MAX_TOKENS N_PARALLEL N_CTX_PER_SEQ [--tools=JSON] PROMPT...: Python's
greedy tokens for the R tests. A prompt is "text:..." (raw text) or "chat:..." (one user
message); with --tools, every prompt is asked for a call of them (tool_choice "required")."""
import sys

import fastpar

path, max_tokens, n_parallel, n_ctx = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
args = sys.argv[5:]
options = {}
if args and args[0].startswith("--tools="):
    options = {"tools": args.pop(0)[len("--tools="):], "tool_choice": "required"}
prompts = [a[5:] if a.startswith("text:") else [{"role": "user", "content": a[5:]}] for a in args]
ctx = fastpar.Context(fastpar.Model(path), n_parallel=n_parallel, n_ctx_per_seq=n_ctx)
for c in fastpar.generate_parallel(ctx, prompts, max_tokens=max_tokens, temperature=0.0, **options):
    print("TOKENS", *c.token_ids)
