"""Scoring texts: log-likelihoods (lm-evaluation-harness's semantics) and perplexity
(llama.cpp's ``llama-perplexity`` method).

Every request here is a prompt with ``prompt_logprobs`` and ``max_tokens=0``: the one loop
decodes it beside the others and returns each prompt token's log-probability; nothing is
generated. docs/api.md ("Scoring") documents the tokenization rules.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Callable, List, NamedTuple, Optional, Tuple, Union

from . import _core
from ._context import Context
from ._options import _keywords_checked
from ._prompts import _text

__all__ = ["Loglikelihood", "Perplexity", "RollingLoglikelihood", "loglikelihood", "loglikelihood_rolling",
           "perplexity"]


class _Pair(NamedTuple):
    logprob: float
    is_greedy: bool


class Loglikelihood(_Pair):
    """``(logprob, is_greedy)`` of one continuation given its context: the sum of the
    continuation tokens' log-probabilities, and whether each was the most likely token.
    ``error`` is None, or why this pair could not be scored (then ``logprob`` is NaN)."""

    def __new__(cls, logprob: float, is_greedy: bool, error: Optional[str] = None) -> "Loglikelihood":
        self = super().__new__(cls, logprob, is_greedy)
        self.error = error
        return self


class RollingLoglikelihood(float):
    """A text's log-likelihood (a float), with ``n_tokens`` scored and ``error`` (None, or
    why the text could not be scored; the value is then NaN)."""

    n_tokens: int = 0
    error: Optional[str] = None


class Perplexity:
    """llama-perplexity's numbers for one text.

    ``perplexity``: exp of the mean negative log-likelihood over every scored token;
    ``chunks``: the running value after each chunk (what llama-perplexity prints as
    ``[1]..., [2]...``); ``chunk_perplexities``: each chunk's own; ``nll`` the sum of negative
    log-likelihoods; ``n_tokens`` the text's tokens; ``n_chunks``; ``n_scored`` the tokens
    scored (``n_chunks * (n_ctx - n_ctx // 2 - 1)``); ``std_error``: the standard error of
    the estimate as llama-perplexity prints it (``+/-``); ``error``: None, or why the text could
    not be measured (then ``perplexity`` is NaN).
    """

    def __init__(self, n_ctx: int, n_tokens: int) -> None:
        self.n_ctx = n_ctx
        self.n_tokens = n_tokens
        self.perplexity = math.nan
        self.chunks: List[float] = []
        self.chunk_perplexities: List[float] = []
        self.nll = 0.0
        self.n_chunks = 0
        self.n_scored = 0
        self.std_error = math.nan
        self.error: Optional[str] = None

    def __repr__(self) -> str:
        if self.error is not None:
            return f"Perplexity(error={self.error!r})"
        return (f"Perplexity(perplexity={self.perplexity:.4f}, std_error={self.std_error:.5f}, "
                f"n_chunks={self.n_chunks}, n_scored={self.n_scored}, n_ctx={self.n_ctx})")


def _check_ctx(ctx: object) -> Context:
    if not isinstance(ctx, Context):
        raise TypeError(f"ctx must be a fastpar.Context, got {type(ctx).__name__}")
    return ctx


def _tokenize(ctx: Context, text: str, add_special: bool = True, parse_special: bool = True) -> List[int]:
    return ctx.model.tokenize(text, add_special=add_special, parse_special=parse_special)


def prefix_token(ctx: Context) -> int:
    """The token an empty context stands for (``Model.prefix_token``)."""
    return ctx.model.prefix_token


def encode_pair(ctx: Context, context: str, continuation: str) -> Tuple[List[int], List[int]]:
    """``(context_tokens, continuation_tokens)`` as lm-evaluation-harness tokenizes a pair
    for a causal model (``TemplateLM.loglikelihood`` and ``_encode_pair``): trailing
    whitespace of the context moves to the start of the continuation; the whole text and
    the context are tokenized (BOS as the vocabulary asks) and the continuation is what the
    whole has beyond the context's tokens. An empty context becomes the prefix token
    (``prefix_token``) before the continuation tokenized without BOS."""
    if context == "":
        cont = _tokenize(ctx, continuation, add_special=False)
        prefix = prefix_token(ctx)
        if not cont or prefix != cont[0]:
            return [prefix], cont
        return cont[:1], cont[1:]
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces > 0:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    whole = _tokenize(ctx, context + continuation)
    context_enc = _tokenize(ctx, context)
    return context_enc, whole[len(context_enc):]


def _score_params(score_from: int) -> _core.GenerateParams:
    p = _core.GenerateParams()
    p.max_tokens = 0
    p.prompt_logprobs = True
    p.prompt_logprobs_from = score_from
    p.temperature = 0.0
    p.seed = 0  # nothing is sampled; a fixed seed spares drawing one per request
    return p


def _run(ctx: Context, prompts: List[List[int]], starts: List[int], progress: bool, desc: str,
         on_done: Optional[Callable[[int, _core.Completion], None]] = None) -> List[_core.Completion]:
    """Scores every prompt from its start in one call of the loop; results in input order.
    Prompts that begin alike are submitted next to each other, so that they share slots
    at the same time and their common prefix is decoded once (prefix sharing)."""
    order = sorted(range(len(prompts)), key=lambda i: prompts[i])
    params = [_score_params(starts[i]) for i in order]
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(prompts), unit="request", desc=desc)

    def done(k: int, c: _core.Completion) -> None:
        if on_done is not None:
            on_done(order[k], c)
        if bar is not None:
            bar.update(1)

    try:
        out = ctx._ctx.generate([prompts[i] for i in order], params, done)
    finally:
        if bar is not None:
            bar.close()
    results: List[_core.Completion] = [None] * len(prompts)  # type: ignore[list-item]
    for k, i in enumerate(order):
        results[i] = out[k]
    return results


def _loglikelihood_tokens(ctx: Context, pairs: Sequence[Tuple[List[int], List[int]]], progress: bool = False
                          ) -> List[Loglikelihood]:
    """Scores (context_tokens, continuation_tokens) pairs. As lm-evaluation-harness's
    causal models do, a pair longer than the window (``n_ctx_per_seq + 1`` tokens: the last
    one is never decoded) loses tokens from the left of its context."""
    limit = ctx.n_ctx_per_seq + 1
    results: List[Optional[Loglikelihood]] = [None] * len(pairs)
    prompts: List[List[int]] = []
    starts: List[int] = []
    index: List[int] = []
    for i, (context, continuation) in enumerate(pairs):
        if not continuation:
            results[i] = Loglikelihood(math.nan, False, "the continuation has no tokens")
            continue
        if not context:
            results[i] = Loglikelihood(math.nan, False, "the context has no tokens: nothing predicts the first "
                                       "continuation token")
            continue
        tokens = (list(context) + list(continuation))[-limit:]
        start = len(tokens) - len(continuation)
        if start < 1:
            results[i] = Loglikelihood(math.nan, False,
                                       f"the continuation has {len(continuation)} tokens, but n_ctx_per_seq="
                                       f"{ctx.n_ctx_per_seq} scores at most {limit - 1} after one of context")
            continue
        prompts.append(tokens)
        starts.append(start)
        index.append(i)
    completions = _run(ctx, prompts, starts, progress, "fastpar loglikelihood")
    for k, c in enumerate(completions):
        if c.finish_reason == "error":
            results[index[k]] = Loglikelihood(math.nan, False, c.error)
            continue
        lps = c.prompt_logprobs[starts[k]:]
        results[index[k]] = Loglikelihood(math.fsum(lps), all(c.prompt_greedy[starts[k]:]))
    return results  # type: ignore[return-value]


def _token_list(value: object, where: str) -> Optional[List[int]]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        return None
    out = []
    for t in value:
        if isinstance(t, bool) or not isinstance(t, int):
            raise TypeError(f"{where} must be a str or a list of token ids (int)")
        out.append(t)
    return out


@_keywords_checked
def loglikelihood(ctx: Context, requests: Sequence[Tuple[object, object]], *, progress: bool = False
                  ) -> List[Loglikelihood]:
    """The log-likelihood of each ``(context, continuation)`` pair: a list, in order, of
    ``Loglikelihood(logprob, is_greedy)`` named tuples (lm-evaluation-harness's
    ``loglikelihood``). A pair is two ``str`` (tokenized as ``encode_pair`` says) or two
    lists of token ids. Pairs that begin alike (several continuations of one context) are
    decoded side by side and their common prefix once. A pair that cannot be scored gets
    ``logprob`` NaN and its ``error``; the others are scored.
    """
    _check_ctx(ctx)
    if isinstance(requests, (str, bytes)) or not isinstance(requests, Sequence):
        raise TypeError(f"requests must be a list of (context, continuation) pairs, got {type(requests).__name__}")
    pairs = []
    for i, r in enumerate(requests):
        if isinstance(r, (str, bytes)) or not isinstance(r, Sequence) or len(r) != 2:
            raise TypeError(f"requests[{i}] must be a (context, continuation) pair, got {r!r}")
        context, continuation = r
        if isinstance(context, str) and isinstance(continuation, str):
            pairs.append(encode_pair(ctx, _text(context, f"requests[{i}][0]"), _text(continuation, f"requests[{i}][1]")))
            continue
        a = _token_list(context, f"requests[{i}][0]")
        b = _token_list(continuation, f"requests[{i}][1]")
        if a is None or b is None:
            raise TypeError(f"requests[{i}] must hold two str or two lists of token ids")
        pairs.append((a, b))
    return _loglikelihood_tokens(ctx, pairs, progress)


def rolling_windows(tokens: List[int], prefix: int, max_len: int) -> List[Tuple[List[int], List[int]]]:
    """lm-evaluation-harness's rolling windows with ``context_len=1``
    (``get_rolling_token_windows``, each made disjoint by ``make_disjoint_window``):
    ``(context, continuation)`` token pairs whose continuations cover ``tokens`` once, each
    pair at most ``max_len + 1`` tokens, the first one conditioned on ``prefix`` alone."""
    out: List[Tuple[List[int], List[int]]] = []
    if not tokens:
        return out
    first = min(max_len, len(tokens))
    windows = [([prefix] + tokens[:first - 1], tokens[:first])]
    predicted = first
    while predicted < len(tokens):
        n = min(len(tokens) - predicted, max_len)
        end = predicted + n
        windows.append((tokens[max(0, end - max_len - 1):end - 1], tokens[end - n:end]))
        predicted += n
    for a, b in windows:
        out.append((a[:len(a) - (len(b) - 1)], b))
    return out


@_keywords_checked
def loglikelihood_rolling(ctx: Context, texts: Sequence[str], *, progress: bool = False
                          ) -> List[RollingLoglikelihood]:
    """Each text's whole log-likelihood (lm-evaluation-harness's ``loglikelihood_rolling``):
    the text is tokenized without BOS, its first token conditioned on the prefix token
    (BOS, or EOS), and scored in windows of ``ctx.n_ctx_per_seq`` tokens
    (``rolling_windows``). All windows of all texts ride one call. A text that cannot be
    scored gets NaN and its ``error``."""
    _check_ctx(ctx)
    if isinstance(texts, (str, bytes)) or not isinstance(texts, Sequence):
        raise TypeError(f"texts must be a list of str, got {type(texts).__name__}")
    prefix = prefix_token(ctx)
    pairs: List[Tuple[List[int], List[int]]] = []
    owner: List[int] = []
    n_tokens: List[int] = []
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"texts[{i}] must be a str, got {type(text).__name__}")
        tokens = _tokenize(ctx, _text(text, f"texts[{i}]"), add_special=False)
        n_tokens.append(len(tokens))
        for pair in rolling_windows(tokens, prefix, ctx.n_ctx_per_seq):
            pairs.append(pair)
            owner.append(i)
    scores = _loglikelihood_tokens(ctx, pairs, progress)
    totals = [0.0] * len(texts)
    errors: List[Optional[str]] = [None] * len(texts)
    for s, i in zip(scores, owner):
        if s.error is not None and errors[i] is None:
            errors[i] = s.error
        totals[i] += s.logprob
    out = []
    for i in range(len(texts)):
        r = RollingLoglikelihood(math.nan if errors[i] is not None else totals[i])
        r.n_tokens = n_tokens[i]
        r.error = errors[i]
        out.append(r)
    return out


@_keywords_checked
def perplexity(ctx: Context, text_or_texts: Union[str, Sequence[str]], *, n_ctx: int = 512,
               progress: bool = False) -> Union[Perplexity, List[Perplexity]]:
    """Perplexity by llama.cpp's ``llama-perplexity`` method (its ``perplexity()``): the
    text is tokenized with BOS as the vocabulary asks (special-token text left as text),
    cut into ``len // n_ctx`` chunks of ``n_ctx`` tokens (the rest is dropped), each
    chunk's first token replaced by BOS when the vocabulary adds one, and in each chunk only
    the tokens after position ``n_ctx // 2`` are scored, so that every scored token has
    at least half a window of context. The value is ``exp(nll / count)`` over every scored
    token. Chunks are independent prompts: all of them (of every text) ride one call.

    A ``str`` gives one ``Perplexity`` (``ValueError`` if it is shorter than ``2 * n_ctx``
    tokens, as llama-perplexity refuses it); a list of texts gives a list, and a text that
    cannot be measured gets ``error`` while the others are measured.
    ``ctx.n_ctx_per_seq`` must be at least ``n_ctx - 1`` (the last token of a chunk is
    never decoded).
    """
    _check_ctx(ctx)
    if isinstance(n_ctx, bool) or not isinstance(n_ctx, int):
        raise TypeError(f"n_ctx must be an int, got {type(n_ctx).__name__}")
    if n_ctx < 4:
        raise ValueError(f"n_ctx must be at least 4, got {n_ctx}")
    if ctx.n_ctx_per_seq < n_ctx - 1:
        raise ValueError(f"n_ctx={n_ctx} needs a context with n_ctx_per_seq >= {n_ctx - 1}, "
                         f"this one has {ctx.n_ctx_per_seq}")
    single = isinstance(text_or_texts, str)
    if single:
        texts = [text_or_texts]
    elif isinstance(text_or_texts, Sequence) and not isinstance(text_or_texts, bytes):
        texts = list(text_or_texts)
    else:
        raise TypeError(f"text_or_texts must be a str or a list of str, got {type(text_or_texts).__name__}")
    model = ctx.model._model
    bos = model.token_bos if model.add_bos else None
    first = n_ctx // 2
    results: List[Perplexity] = []
    prompts: List[List[int]] = []
    owner: List[int] = []
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"texts[{i}] must be a str, got {type(text).__name__}")
        tokens = _tokenize(ctx, _text(text, f"texts[{i}]"), add_special=True, parse_special=False)
        r = Perplexity(n_ctx, len(tokens))
        results.append(r)
        if len(tokens) < 2 * n_ctx:
            r.error = (f"the text has {len(tokens)} tokens; perplexity with n_ctx={n_ctx} needs at least "
                       f"{2 * n_ctx} (as llama-perplexity)")
            continue
        r.n_chunks = len(tokens) // n_ctx
        for k in range(r.n_chunks):
            chunk = tokens[k * n_ctx:(k + 1) * n_ctx]
            if bos is not None:
                chunk[0] = bos
            prompts.append(chunk)
            owner.append(i)
    if single and results[0].error is not None:
        raise ValueError(results[0].error)
    completions = _run(ctx, prompts, [first + 1] * len(prompts), progress, "fastpar perplexity")
    nll2 = [0.0] * len(texts)
    for c, i in zip(completions, owner):
        r = results[i]
        if r.error is not None:
            continue
        if c.finish_reason == "error":
            r.error = c.error
            continue
        lps = c.prompt_logprobs[first + 1:]
        chunk_nll = -math.fsum(lps)
        r.nll += chunk_nll
        nll2[i] += math.fsum(v * v for v in lps)
        r.n_scored += len(lps)
        r.chunk_perplexities.append(math.exp(chunk_nll / len(lps)))
        r.chunks.append(math.exp(r.nll / r.n_scored))
    for i, r in enumerate(results):
        if r.error is not None:
            r.chunks, r.chunk_perplexities = [], []
            continue
        mean = r.nll / r.n_scored
        r.perplexity = math.exp(mean)
        var = nll2[i] / r.n_scored - mean * mean
        if var > 0 and r.n_scored > 1:
            r.std_error = math.sqrt(var / (r.n_scored - 1)) * r.perplexity
    if single:
        if results[0].error is not None:
            raise ValueError(results[0].error)
        return results[0]
    return results
