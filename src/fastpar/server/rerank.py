"""``POST /v1/rerank`` (also ``/rerank``, ``/v1/reranking``, ``/reranking``, as llama-server
names it) over a reranker engine (``fastpar serve --rerank``): llama-server's and Jina's
body (``query``, ``documents``, ``top_n``), or Hugging Face TEI's (``query``, ``texts``,
``return_text``). Every (query, document) pair is one engine request, so the pairs of all
connections share the engine's steps."""

from __future__ import annotations

import math
from typing import Any, Awaitable, Callable, Dict, List, Mapping, Tuple

from fastpar import Engine

from .embeddings import embed_all
from .protocol import APIError, _get, _integer

__all__ = ["RERANK_PATHS", "parse_rerank", "rerank_body", "answer_rerank"]

#: The paths llama-server answers reranking on; fastpar answers all of them.
RERANK_PATHS = ("/v1/rerank", "/rerank", "/v1/reranking", "/reranking")


def parse_rerank(body: Any) -> Tuple[str, List[str], Dict[str, Any]]:
    """The query, the documents and how to answer (``tei``: TEI's shape, asked for by
    ``texts``; ``top_n``; ``return_documents``/``return_text``); APIError 400 naming the
    field that is wrong."""
    if not isinstance(body, Mapping):
        raise APIError(400, "the request body must be a JSON object")
    query = body.get("query")
    if not isinstance(query, str):
        raise APIError(400, "'query' must be a string", param="query")
    tei = "texts" in body and "documents" not in body
    field = "texts" if tei else "documents"
    docs = body.get(field)
    if not isinstance(docs, list) or not docs or not all(isinstance(d, str) for d in docs):
        raise APIError(400, f"'{field}' must be a non-empty list of strings", param=field)
    top_n = _integer(body, "top_n", 1, 1 << 30, len(docs))
    give = _get(body, "return_text" if tei else "return_documents", (bool,), "a boolean", False)
    return query, docs, {"tei": tei, "top_n": top_n, "return": give}


def rerank_body(completions: List[Any], docs: List[str], how: Dict[str, Any], model: str) -> Any:
    """The response: results most relevant first, at most ``top_n`` of them. A pair that could
    not be scored gets a null score and OpenAI's error object and comes last; when every
    pair failed, the request is a 400 naming the first."""
    failed = [(i, c) for i, c in enumerate(completions) if c.finish_reason != "stop"]
    if failed and len(failed) == len(completions):
        i, c = failed[0]
        raise APIError(400, f"document {i}: {c.error or c.finish_reason}", param="documents")
    label = "score" if how["tei"] else "relevance_score"
    results = []
    n_tokens = 0
    for i, c in enumerate(completions):
        n_tokens += c.n_prompt_tokens
        entry: Dict[str, Any] = {"index": i}
        if c.finish_reason == "stop":
            entry[label] = c.embedding[0]
        else:
            entry[label] = None
            entry["error"] = {"message": c.error or c.finish_reason, "type": "invalid_request_error", "param": "documents",
                              "code": "invalid_input"}
        if how["return"]:
            if how["tei"]:
                entry["text"] = docs[i]
            else:
                entry["document"] = {"text": docs[i]}
        results.append(entry)
    # Most relevant first, failed pairs last; ties keep the documents' order.
    results.sort(key=lambda e: math.inf if e[label] is None else -e[label])
    results = results[:how["top_n"]]
    if how["tei"]:
        return results
    return {"model": model, "object": "list", "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
            "results": results}


async def answer_rerank(engine: Engine, read_body: Callable[[], Awaitable[Any]], model_name: str) -> Tuple[int, Any, int]:
    """``/v1/rerank``'s answer (embeddings.py's ``vector_endpoint``)."""
    if engine.pooling != "rank":
        raise APIError(400, "this server does not rerank: start fastpar serve with --rerank and a reranker "
                            "model to serve /v1/rerank", code="rerank_not_enabled")
    raw = await read_body()
    query, docs, how = parse_rerank(raw)
    pairs = [engine.model.rerank_tokens(query, d) for d in docs]
    completions = await embed_all(engine, pairs, normalize=False)
    body = rerank_body(completions, docs, how, raw.get("model") or model_name)
    return 200, body, sum(c.n_prompt_tokens for c in completions)
