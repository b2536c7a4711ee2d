"""Command line: ``python -m fastpar demo|serve|run|version`` (or the ``fastpar`` console script)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Dict, List, Optional

DEMO_QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Give me three tips for sleeping better.",
    "Explain photosynthesis in one sentence.",
    "What is 12 times 12?",
    "Name three primary colors.",
    "Suggest a name for a friendly robot.",
    "Why is the sky blue?",
]


class _CommandError(Exception):
    """A failure to report in one line."""


def _check_engine_options(args: argparse.Namespace) -> None:
    """The model and context options, by the library's own rules, before anything starts
    (a model is downloaded or loaded, a port opened): ValueError or TypeError naming the
    option."""
    from fastpar._engine import _max_queued
    from fastpar._options import _CONTEXT_DEFAULTS, _context_params, _model_params

    if args.model is not None and not os.path.isfile(args.model):
        raise _CommandError(f"no such model file: {args.model}")
    _model_params(args.n_gpu_layers, True)
    options = _kv_types(args)
    _context_params(args.n_parallel, args.n_ctx_per_seq, None, args.n_threads,
                    options.pop("kv_unified", _CONTEXT_DEFAULTS.kv_unified), **options)
    if getattr(args, "max_queued", None) is not None:
        _max_queued(args.max_queued)


def _kv_types(args: argparse.Namespace) -> Dict[str, object]:
    """The context options of the command line (--type-k, --type-v, --kv-unified,
    --prefix-cache-mib, --prefix-cache-dir; serve's --embeddings and --pooling) as the
    library's keywords: those given (else its defaults)."""
    names = ("type_k", "type_v", "kv_unified", "prefix_cache_mib", "prefix_cache_dir", "embeddings", "pooling")
    return {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}


def _demo(args: argparse.Namespace) -> int:
    import fastpar
    from fastpar._models import DEFAULT_MODEL_NAME

    if args.model:
        model = fastpar.Model(args.model, n_gpu_layers=args.n_gpu_layers)
        label = f"{os.path.basename(args.model)} ({model.description})"
    else:
        try:
            path = fastpar.default_model_path()
        except RuntimeError as e:  # the download or its checksum failed
            raise _CommandError(str(e)) from e
        model = fastpar.Model(path, n_gpu_layers=args.n_gpu_layers)
        label = DEFAULT_MODEL_NAME
    ctx = fastpar.Context(model, n_parallel=args.n_parallel, n_ctx_per_seq=args.n_ctx_per_seq,
                          n_threads=args.n_threads)
    prompts = [[{"role": "user", "content": q}] for q in DEMO_QUESTIONS]
    results = fastpar.generate_parallel(ctx, prompts, max_tokens=args.max_tokens, temperature=args.temperature,
                                        seed=args.seed)
    print(f"fastpar {fastpar.__version__} ({fastpar.backend()}): {len(prompts)} prompts in one call, "
          f"n_parallel={ctx.n_parallel}, model {label}\n")
    for question, c in zip(DEMO_QUESTIONS, results):
        print(f"Q: {question}")
        answer = c.text.strip() if c.finish_reason != "error" else f"<error: {c.error}>"
        print(f"A: {answer}")
        shared = f" ({c.n_prompt_tokens_shared} shared)" if c.n_prompt_tokens_shared else ""
        n_prompt = c.n_prompt_tokens + c.n_prompt_tokens_shared + c.n_prompt_tokens_cached
        print(f"   [{c.finish_reason}, {n_prompt} prompt{shared} + "
              f"{c.n_gen_tokens} generated tokens]\n")
    s = ctx.last_stats
    print("stats:")
    print(f"  prompt tokens     {s.n_prompt_tokens:8d}   {s.t_prompt_ms:9.1f} ms   {s.prompt_tokens_per_s:8.1f} tok/s")
    print(f"  generated tokens  {s.n_gen_tokens:8d}   {s.t_gen_ms:9.1f} ms   {s.gen_tokens_per_s:8.1f} tok/s")
    print(f"  wall              {'':8s}   {s.t_wall_ms:9.1f} ms   {s.total_tokens_per_s:8.1f} tok/s in all")
    print(f"  prompt tokens copied from a shared prefix instead of decoded: {s.n_prompt_tokens_shared}")
    print(f"  decode calls {s.n_decode_calls}, KV-full retries {s.n_kv_full_retries}, failed prompts {s.n_failed}")
    print(f"  choosing tokens {s.t_sample_ms:.1f} ms of the generation time, padding tokens {s.n_padding_tokens}")
    print(f"  backend {s.backend}, {s.n_device_sampled} tokens sampled on the device")
    return 0 if s.n_failed == 0 else 1


def _serve(args: argparse.Namespace) -> int:
    try:
        from fastpar.server import serve
    except ImportError as e:
        raise _CommandError(str(e)) from e
    _check_engine_options(args)
    from fastpar.server.protocol import Limits

    limits = Limits(max_body_mib=args.max_body_mib, max_n=args.max_n, max_prompts=args.max_prompts,
                    max_tokens=args.max_tokens)  # ValueError naming a bad one
    # serve() checks its own options (port, shutdown timeout) before it opens the port.
    return serve(args.model, host=args.host, port=args.port, n_parallel=args.n_parallel, limits=limits,
                 n_ctx_per_seq=args.n_ctx_per_seq, n_gpu_layers=args.n_gpu_layers, n_threads=args.n_threads,
                 max_queued=args.max_queued, **_kv_types(args), api_key=args.api_key or os.environ.get("FASTPAR_API_KEY") or None,
                 model_name=args.model_name, stream_interval=args.stream_interval,
                 shutdown_timeout=args.shutdown_timeout, log_level=args.log_level)


def _run(args: argparse.Namespace) -> int:
    import fastpar
    from fastpar.server.batch import BatchInterrupted, run_batch

    if not os.path.isfile(args.input):
        raise _CommandError(f"no such input file: {args.input}")
    if args.limit is not None and args.limit < 1:
        raise _CommandError(f"--limit must be >= 1, got {args.limit}")
    _check_engine_options(args)
    try:
        path = args.model or fastpar.default_model_path()
    except RuntimeError as e:  # the download or its checksum failed
        raise _CommandError(str(e)) from e
    model = fastpar.Model(path, n_gpu_layers=args.n_gpu_layers)
    ctx = fastpar.Context(model, n_parallel=args.n_parallel, n_ctx_per_seq=args.n_ctx_per_seq,
                          n_threads=args.n_threads, **_kv_types(args))
    name = args.model_name or os.path.splitext(os.path.basename(path))[0]
    try:
        counts = run_batch(ctx, args.input, args.output, limit=args.limit, progress=not args.quiet,
                           model_name=name)
    except BatchInterrupted as e:
        c = e.counts
        print(f"fastpar: interrupted: {c['answered']} answered, {c['failed']} failed, {c['left']} left; "
              "rerun the same command to finish", file=sys.stderr)
        return 130
    summary = f"{counts['answered']} answered, {counts['failed']} failed, {counts['skipped']} already in {args.output}"
    if counts["left"]:
        summary += f"; {counts['left']} left: rerun the same command to go on"
    if counts["failed"]:
        summary += f"; the failed lines' errors are in {args.output}, and a rerun tries them again"
    print(summary, file=sys.stderr)
    return 1 if counts["failed"] else 0


def _engine_options(p: argparse.ArgumentParser, prefix_cache_mib: Optional[int]) -> None:
    """The model and context options of serve and run; ``prefix_cache_mib`` is the command's
    default for --prefix-cache-mib (None: the library's)."""
    from fastpar._options import _CONTEXT_DEFAULTS
    from fastpar.server.protocol import N_CTX_PER_SEQ

    p.add_argument("--n-parallel", type=int, default=8, help="slots: requests generated together (default 8)")
    # One default for serve and run: both answer OpenAI-format requests of lengths not known
    # in advance, and a request file behaves the same through either (the library's Context
    # keeps a smaller default: its user sizes the KV cache for their prompts).
    p.add_argument("--n-ctx-per-seq", type=int, default=N_CTX_PER_SEQ,
                   help=f"positions one prompt plus its answer may use; the KV cache holds n-parallel x this "
                        f"(default {N_CTX_PER_SEQ} in serve and run alike, for requests of any length)")
    p.add_argument("--n-gpu-layers", type=int, default=0, help="-1 = all (needs a CUDA or Metal build)")
    p.add_argument("--n-threads", type=int, default=None)
    for which in ("k", "v"):
        p.add_argument(f"--type-{which}", default=None, metavar="TYPE",
                       help=f"the KV cache's {which.upper()} type: f16 (default), bf16, f32, q8_0 or q4_0; "
                            "q8_0 holds about 1.9x the positions in the same memory (docs/performance.md)")
    p.add_argument("--kv-unified", action="store_true", default=None,
                   help="one KV buffer for all slots (Context's kv_unified): on a GPU, outputs of different "
                        "lengths run faster with it, a lockstep load slower (docs/performance.md); off by default")
    p.add_argument("--prefix-cache-mib", type=int, default=prefix_cache_mib, metavar="MIB",
                   help="host memory for the prefix cache, which keeps finished requests' KV so that a "
                        "later request with the same start (a chat's next turn) decodes only the rest; "
                        "-1 = a quarter of the available memory, at most 8192; 0 = off "
                        f"(default {_CONTEXT_DEFAULTS.prefix_cache_mib if prefix_cache_mib is None else prefix_cache_mib})")
    p.add_argument("--prefix-cache-dir", default=None, metavar="DIR",
                   help="keep the prefix cache in this folder across restarts (with --prefix-cache-mib); "
                        "files from another model, KV type or build are refused")
    p.add_argument("--embeddings", action="store_true",
                   help="embed instead of generating: answer /v1/embeddings (an embeddings context)")
    p.add_argument("--pooling", default=None, choices=["mean", "cls", "last"],
                   help="with --embeddings: how a text's token vectors become one (default: the model's "
                        "own, else mean)")
    p.add_argument("--model-name", default=None, help="the model's name in responses (default: the file's name)")


def _parse(argv: Optional[List[str]]) -> argparse.Namespace:
    """The command line's arguments; a usage mistake exits with status 2 and one line."""
    from fastpar.server.protocol import MAX_BODY_MIB, MAX_N, MAX_PROMPTS, SERVE_PREFIX_CACHE_MIB

    # No abbreviations: `--model` must never be taken for `--model-name`.
    parser = argparse.ArgumentParser(prog="fastpar", description="Many prompts through one llama.cpp model at once.",
                                     allow_abbrev=False)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="answer 8 chat prompts in one call on the default model and print the stats",
                          allow_abbrev=False)
    demo.add_argument("--model", help="GGUF file (default: the default model, fetched on first use)")
    demo.add_argument("--n-parallel", type=int, default=8)
    demo.add_argument("--n-ctx-per-seq", type=int, default=1024)
    demo.add_argument("--n-threads", type=int, default=None)
    demo.add_argument("--n-gpu-layers", type=int, default=0, help="-1 = all (needs a CUDA or Metal build)")
    demo.add_argument("--max-tokens", type=int, default=96)
    demo.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    demo.add_argument("--seed", type=int, default=None)
    serve = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (needs: pip install 'fastpar[server]')",
                           allow_abbrev=False)
    serve.add_argument("model_file", nargs="?", default=None, metavar="model",
                       help="GGUF file (default: the default model)")
    serve.add_argument("--model", default=None, help="GGUF file, as the positional argument")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    # The server keeps its prefix cache by default, as llama-server keeps its prompt cache: a
    # chat's turns come as separate requests (docs/server.md says what it changes); a batch
    # file, like the library, gets each line's output independent of the lines before it.
    _engine_options(serve, prefix_cache_mib=SERVE_PREFIX_CACHE_MIB)
    serve.add_argument("--rerank", "--reranking", action="store_true",
                       help="score (query, document) pairs with a reranker model: answer /v1/rerank "
                            "(--embeddings with rank pooling)")
    serve.add_argument("--max-queued", type=int, default=1024,
                       help="requests that may wait for a slot; one more is answered 429 (default 1024)")
    # What one request may ask: each over its limit is a 400 naming the option.
    serve.add_argument("--max-body-mib", type=float, default=MAX_BODY_MIB,
                       help=f"largest request body in MiB (default {MAX_BODY_MIB:g})")
    serve.add_argument("--max-n", type=int, default=MAX_N, help=f"most samples (n) a request (default {MAX_N})")
    serve.add_argument("--max-prompts", type=int, default=MAX_PROMPTS,
                       help=f"most prompts in one /v1/completions request (default {MAX_PROMPTS})")
    serve.add_argument("--max-tokens", type=int, default=None,
                       help="most tokens a request may generate, also the default of one that names none "
                            "(default: --n-ctx-per-seq)")
    serve.add_argument("--stream-interval", type=int, default=1, metavar="N",
                       help="send a streamed choice's text in events of at least N tokens (its first and "
                            "last at once): fewer events, less work a token under many streams (default 1)")
    serve.add_argument("--api-key", default=None,
                       help="require 'Authorization: Bearer KEY' on /v1/* (default: $FASTPAR_API_KEY, else none)")
    serve.add_argument("--shutdown-timeout", type=float, default=5.0,
                       help="seconds requests in flight may finish after SIGTERM before they are cancelled")
    serve.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    run = sub.add_parser("run", help="answer a file of requests in OpenAI's batch format (resumable)",
                         allow_abbrev=False)
    run.add_argument("input", help="JSONL file: one {custom_id, method, url, body} request per line")
    run.add_argument("-o", "--output", required=True,
                     help="JSONL file of results; appended to: the custom_ids it answers are skipped, "
                          "its failed lines are tried again")
    run.add_argument("--model", help="GGUF file (default: the default model, fetched on first use)")
    _engine_options(run, prefix_cache_mib=None)
    run.add_argument("--limit", type=int, default=None, help="answer at most this many new lines, then stop")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    sub.add_parser("version", help="print the version and backend", allow_abbrev=False)
    args = parser.parse_args(argv)
    if args.command == "serve":
        if args.model is not None and args.model_file is not None and args.model != args.model_file:
            serve.error(f"two models given: {args.model_file} and --model {args.model}; give one")
        args.model = args.model if args.model is not None else args.model_file
        if args.rerank:
            if args.pooling is not None:
                serve.error(f"--rerank pools by rank; --pooling {args.pooling} is for --embeddings")
            args.embeddings, args.pooling = True, "rank"
    return args


def main(argv: Optional[List[str]] = None) -> int:
    args = _parse(argv)
    if args.command in ("demo", "serve", "run"):
        # A mistake in what the command was given (a missing or unloadable model, a bad
        # option value, a failed download) is one line for the user, not a traceback;
        # anything else is a bug and keeps its traceback.
        import fastpar

        try:
            return {"demo": _demo, "serve": _serve, "run": _run}[args.command](args)
        except (_CommandError, OSError, ValueError, TypeError, fastpar.FastparError) as e:
            print(f"fastpar: error: {e}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print("fastpar: interrupted", file=sys.stderr)
            return 130
    import fastpar

    print(f"fastpar {fastpar.__version__} ({fastpar.backend()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
