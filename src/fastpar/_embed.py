"""``embed``: one vector per text, many texts through one model at once."""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Sequence

import numpy as np

from ._context import Context
from ._options import _bool, _keywords_checked
from ._prompts import _prompts

__all__ = ["Embeddings", "embed"]


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
    if pooling is not None and pooling != ctx.pooling:
        raise ValueError(f"this context pools by {ctx.pooling!r}; pooling={pooling!r} needs a context made with "
                         f"fastpar.Context(model, embeddings=True, pooling={pooling!r})")
    normalize = _bool("normalize", normalize)
    if on_completion is not None and not callable(on_completion):
        raise TypeError("on_completion must be callable")
    converted = _prompts(texts)
    if progress:
        from tqdm.auto import tqdm

        with tqdm(total=len(converted), unit="text", desc="fastpar") as bar:
            def update(i: int, completion: Any) -> None:
                if on_completion is not None:
                    on_completion(i, completion)
                bar.update(1)

            rows, errors = ctx._ctx.embed(converted, normalize, update)
            bar.set_postfix_str(f"{ctx.last_stats.prompt_tokens_per_s:.0f} tok/s")
    else:
        rows, errors = ctx._ctx.embed(converted, normalize, on_completion)
    return Embeddings(rows, {i: e for i, e in enumerate(errors) if e is not None})
