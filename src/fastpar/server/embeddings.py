"""``POST /v1/embeddings`` (OpenAI's schema) over an embeddings engine (``fastpar serve
--embeddings``): every input becomes one engine request, so texts of all connections share
the engine's steps, as prompts do for generation."""

from __future__ import annotations

import asyncio
import base64
import struct
import time
from typing import Any, Awaitable, Callable, Dict, List, Mapping, Tuple, Union

from fastpar import Engine, QueueFull, Request

from .protocol import APIError

__all__ = ["vector_endpoint", "answer_embeddings", "parse_embeddings", "embed_all", "embeddings_body"]

Text = Union[str, List[int]]


def parse_embeddings(body: Any, dim: int) -> Tuple[List[Text], str]:
    """The request's inputs and encoding; APIError 400 naming the field that is wrong.
    ``input``: a string, a list of strings, a list of token ids or a list of such lists.
    ``encoding_format``: ``"float"`` (default) or ``"base64"`` (little-endian float32, as
    OpenAI's). ``dimensions``: only the model's own (its vectors cannot be shortened)."""
    if not isinstance(body, Mapping):
        raise APIError(400, "the request body must be a JSON object")
    raw = body.get("input")
    if isinstance(raw, str):
        texts: List[Text] = [raw]
    elif isinstance(raw, list) and raw and all(_is_id(t) for t in raw):
        texts = [list(raw)]
    elif isinstance(raw, list) and raw and all(isinstance(t, str) or (isinstance(t, list) and t and all(_is_id(x) for x in t))
                                               for t in raw):
        texts = [t if isinstance(t, str) else list(t) for t in raw]
    else:
        raise APIError(400, "'input' must be a string, a non-empty list of strings, a list of token ids, or a "
                            "list of non-empty token-id lists", param="input")
    fmt = body.get("encoding_format", "float") or "float"
    if fmt not in ("float", "base64"):
        raise APIError(400, f"'encoding_format' must be 'float' or 'base64', got {fmt!r}", param="encoding_format")
    dims = body.get("dimensions")
    if dims is not None and (isinstance(dims, bool) or not isinstance(dims, int) or dims != dim):
        raise APIError(400, f"this model's vectors have {dim} dimensions and cannot be shortened; 'dimensions' "
                            f"may only be {dim}, got {dims!r}", param="dimensions")
    return texts, fmt


def _is_id(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


async def embed_all(engine: Engine, texts: List[Text], normalize: bool = True) -> List[Any]:
    """Submits every text and awaits every completion, in input order. A full queue is a 429
    (what was submitted is cancelled); leaving early (a disconnect) cancels the rest."""
    requests: List[Request] = []
    try:
        for t in texts:
            requests.append(engine.submit_embedding(t, normalize=normalize))
    except QueueFull:
        for r in requests:
            r.cancel()
        raise APIError(429, "the server's queue is full; retry later", "rate_limit_error", code="queue_full") from None
    try:
        return list(await asyncio.gather(*(r.aresult() for r in requests)))
    finally:
        for r in requests:  # a failing or cancelled gather leaves no request running
            if not r.done():
                r.cancel()


def embeddings_body(completions: List[Any], fmt: str, model: str) -> Tuple[int, Dict[str, Any]]:
    """The status and OpenAI's response body. A text that could not be embedded gets an entry
    whose ``embedding`` is null and whose ``error`` is OpenAI's error object; when every
    text failed, the request is a 400 naming the first."""
    failed = [(i, c) for i, c in enumerate(completions) if c.finish_reason != "stop"]
    if failed and len(failed) == len(completions):
        i, c = failed[0]
        raise APIError(400, f"input {i}: {c.error or c.finish_reason}", param="input")
    data = []
    n_tokens = 0
    for i, c in enumerate(completions):
        n_tokens += c.n_prompt_tokens
        entry: Dict[str, Any] = {"object": "embedding", "index": i}
        if c.finish_reason != "stop":
            entry["embedding"] = None
            entry["error"] = {"message": c.error or c.finish_reason, "type": "invalid_request_error",
                              "param": "input", "code": "invalid_input"}
        elif fmt == "base64":
            entry["embedding"] = base64.b64encode(struct.pack(f"<{len(c.embedding)}f", *c.embedding)).decode()
        else:
            entry["embedding"] = c.embedding
        data.append(entry)
    return 200, {"object": "list", "data": data, "model": model,
                 "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}}


Answer = Callable[[Engine, Callable[[], Awaitable[Any]], str], Awaitable[Tuple[int, Any, int]]]


def vector_endpoint(name: str, answer: Answer, state: Any, error: Callable[[APIError], Any],
                    shutting_down: Callable[[], APIError], json_body: Callable) -> Callable:
    """A route of an embeddings engine (``/v1/embeddings``, ``/v1/rerank``) over the
    application's state (app.py's ``_State``): the key, the shutdown and the engine's loading
    are checked, then ``answer(engine, read_body, model_name)`` checks the engine's kind,
    reads the body and returns (status, response body, prompt tokens); the metrics count it
    under ``name``. Starlette is imported here: ``fastpar run`` uses the rest of this module
    without the server extra."""
    from starlette.responses import JSONResponse

    metrics = state.metrics

    async def run(request: Any) -> Any:
        t0 = time.monotonic()
        try:
            state.check_key(request)
            if state.stopping:
                raise shutting_down()
            status, body, n_tokens = await answer(state.ready(), lambda: json_body(request), state.model_name)
        except APIError as e:
            outcome = {400: "bad_request", 401: "unauthorized", 429: "queue_full"}.get(e.status, "error")
            metrics.requests.labels(name, outcome).inc()
            return error(e)
        metrics.requests.labels(name, "success").inc()
        metrics.latency.observe(time.monotonic() - t0)
        metrics.prompt_tokens.inc(n_tokens)
        return JSONResponse(body, status_code=status)

    return run


async def answer_embeddings(engine: Engine, read_body: Callable[[], Awaitable[Any]],
                            model_name: str) -> Tuple[int, Any, int]:
    """``/v1/embeddings``' answer (``vector_endpoint``)."""
    if not engine.embeddings:
        raise APIError(400, "this server generates: start fastpar serve with --embeddings to serve "
                            "/v1/embeddings", code="embeddings_not_enabled")
    if engine.pooling == "rank":
        raise APIError(400, "this server reranks (fastpar serve --rerank): POST /v1/rerank, or start one "
                            "with --embeddings and an embedding model", code="embeddings_not_enabled")
    raw = await read_body()
    texts, fmt = parse_embeddings(raw, engine.embedding_size)
    completions = await embed_all(engine, texts)
    status, body = embeddings_body(completions, fmt, raw.get("model") or model_name)
    return status, body, body["usage"]["prompt_tokens"]
