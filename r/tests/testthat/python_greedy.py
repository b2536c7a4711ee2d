"""python_greedy.py MODEL MAX_TOKENS N_PARALLEL N_CTX_PER_SEQ PROMPT...: Python's greedy
tokens for the R tests. A prompt is "text:..." (raw text) or "chat:..." (one user message)."""
import sys

import fastpar

path, max_tokens, n_parallel, n_ctx = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
prompts = [a[5:] if a.startswith("text:") else [{"role": "user", "content": a[5:]}] for a in sys.argv[5:]]
ctx = fastpar.Context(fastpar.Model(path), n_parallel=n_parallel, n_ctx_per_seq=n_ctx)
for c in fastpar.generate_parallel(ctx, prompts, max_tokens=max_tokens, temperature=0.0):
    print("TOKENS", *c.token_ids)
