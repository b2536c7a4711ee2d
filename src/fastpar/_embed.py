"""``embed`` and ``rerank``: one vector per text, or one relevance score per (query,
document) pair, many at once through one model."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Union

import numpy as np

from ._context import Context
from ._options import _bool, _keywords_checked
from ._prompts import _prompts

__all__ = ["Embeddings", "Scores", "embed", "rerank"]


class Embeddings(np.ndarray):
    """The rows ``fastpar.embed`` returns: a float32 ``numpy.ndarray`` of shape
    ``(len(texts), dim)``, plus ``errors``, a dict from the index of each text that could not
    be embedded to the reason. Such a text's row is NaN, never a vector of zeros that would
    pass for one."""

    errors: Dict[int, str]

    def __new__(cls, rows: np.ndarray, errors: Dict[int, str]) -> "Embeddings":
        out = np.asarray(rows).view(cls)
        out.errors = errors
        return out

    def __array_finalize__(self, obj: Any) -> None:
        # Slices and copies keep the dict of the array they came from (indices of the whole).
        self.errors = getattr(obj, "errors", {})


@_keywords_checked
def embed(ctx: Context, texts: Sequence[Any], *, normalize: bool = True, pooling: Optional[str] = None,
          progress: bool = False, on_completion: Optional[Callable[[int, Any], None]] = None) -> Embeddings:
    """Embed every text in one unified batch; one row per text, in input order.

    ``ctx`` must be made with ``embeddings=True``. A text is a ``str``, a list of token ids,
    or a list of chat messages (rendered with the model's template), as for
    ``generate_parallel``. Each text gets its own sequence and is decoded whole in one batch
    with others; more texts than ``ctx.n_parallel`` are queued and fill slots as they free up.

    ``normalize`` (default ``True``) scales every row to unit Euclidean length, as
    llama.cpp's ``llama-embedding`` does by default. ``pooling``, when given, must be the
    context's own (``ctx.pooling``): llama.cpp pools inside the model's graph, which a
    context builds once (``Context(..., pooling=...)`` chooses it).

    Returns ``Embeddings``, a float32 ``numpy.ndarray`` of shape ``(len(texts), dim)``. A text
    that cannot be embedded (empty, longer than a batch, a failed decode) fails alone: its
    row is NaN and ``result.errors[i]`` says why; the others are computed. ``progress=True``
    shows a progress bar; ``on_completion(index, completion)`` is called as each text
    finishes (``completion.embedding`` holds its vector). Ctrl-C cancels the call and leaves
    the context clean.
    """
    if not isinstance(ctx, Context):
        raise TypeError(f"ctx must be a fastpar.Context, got {type(ctx).__name__}")
    if not ctx.embeddings:
        raise ValueError("ctx was made for generation: make one with fastpar.Context(model, embeddings=True)")
    if ctx.pooling == "rank":
        raise ValueError("ctx was made for a reranker (pooling 'rank'), which scores (query, document) pairs: "
                         "use fastpar.rerank(ctx, query, documents)")
    if pooling is not None and pooling != ctx.pooling:
        raise ValueError(f"this context pools by {ctx.pooling!r}; pooling={pooling!r} needs a context made with "
                         f"fastpar.Context(model, embeddings=True, pooling={pooling!r})")
    normalize = _bool("normalize", normalize)
    if on_completion is not None and not callable(on_completion):
        raise TypeError("on_completion must be callable")
    rows, errors = _run(ctx, _prompts(texts), normalize, progress, on_completion, "text")
    return Embeddings(rows, {i: e for i, e in enumerate(errors) if e is not None})


def _run(ctx: Context, converted: Any, normalize: bool, progress: bool,
         on_completion: Optional[Callable[[int, Any], None]], unit: str) -> Any:
    """The core's rows and per-text errors for `converted` prompts, with a progress bar."""
    if not progress:
        return ctx._ctx.embed(converted, normalize, on_completion)
    from tqdm.auto import tqdm

    with tqdm(total=len(converted), unit=unit, desc="fastpar") as bar:
        def update(i: int, completion: Any) -> None:
            if on_completion is not None:
                on_completion(i, completion)
            bar.update(1)

        out = ctx._ctx.embed(converted, normalize, update)
        bar.set_postfix_str(f"{ctx.last_stats.prompt_tokens_per_s:.0f} tok/s")
    return out


class Scores(Embeddings):
    """The scores ``fastpar.rerank`` returns: a float32 ``numpy.ndarray``, plus ``errors``, a
    dict from the index of each pair that could not be scored (the document's index for one
    query, ``(query index, document index)`` for several) to the reason. Such a score is NaN."""


@_keywords_checked
def rerank(ctx: Context, query: Union[str, Sequence[str]], documents: Sequence[str], *,
           progress: bool = False) -> Scores:
    """How relevant each document is to the query, by a reranker model (the bge-reranker kind).

    ``ctx`` is an embeddings context with ``"rank"`` pooling (a reranker's GGUF names it;
    ``fastpar.Context(model, embeddings=True, pooling="rank")`` otherwise). Each (query,
    document) pair is one text, made as llama-server's ``/rerank`` makes it (the model's
    rerank template, else ``[BOS] query [EOS] [SEP] document [EOS]`` as the vocabulary adds
    them), and all pairs share the loop's batches as ``fastpar.embed``'s texts do. A score
    is the model's classification output for its pair as llama.cpp computes it (higher is
    more relevant; no sigmoid), as llama-server's ``relevance_score``.

    ``query`` a ``str``: returns ``Scores`` of shape ``(len(documents),)``, in document order.
    A list of queries: shape ``(len(query), len(documents))``, every query against every
    document. A pair that cannot be scored (longer than a batch) fails alone: its score is
    NaN and ``result.errors`` says why. ``progress=True`` shows a progress bar.
    """
    if not isinstance(ctx, Context):
        raise TypeError(f"ctx must be a fastpar.Context, got {type(ctx).__name__}")
    if not ctx.embeddings or ctx.pooling != "rank":
        made = "generation" if not ctx.embeddings else f"embeddings with pooling {ctx.pooling!r}"
        raise ValueError(f"ctx was made for {made}: rerank needs a reranker's context, "
                         "fastpar.Context(model, embeddings=True, pooling='rank')")
    several = not isinstance(query, str)
    queries: List[str] = _strings("query", query) if several else [query]
    docs = _strings("documents", documents)
    progress = _bool("progress", progress)
    pairs = [ctx.model.rerank_tokens(q, d) for q in queries for d in docs]
    rows, errors = _run(ctx, _prompts(pairs), False, progress, None, "pair")
    scores = np.asarray(rows)[:, 0] if len(pairs) else np.zeros(0, dtype=np.float32)
    # The reasons speak of a text: here the query and a document together.
    failed = {divmod(k, len(docs)) if several else k: e for k, e in enumerate(errors) if e is not None}
    return Scores(scores.reshape(len(queries), len(docs)) if several else scores, failed)


def _strings(name: str, values: Any) -> List[str]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"{name} must be a list of str, got {type(values).__name__}")
    for i, v in enumerate(values):
        if not isinstance(v, str):
            raise TypeError(f"{name}[{i}] must be a str, got {type(v).__name__}")
    return list(values)
