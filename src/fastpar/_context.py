"""``Context`` and ``generate_parallel``: many prompts through one model in one call."""

from __future__ import annotations

import os
from collections.abc import Sized
from typing import Any, Callable, List, Optional, Sequence, Union

from . import _core
from ._model import Model
from ._options import (_CONTEXT_DEFAULTS, SamplingParams, _context_params, _keywords_checked, _params_list,
                       _with_options)
from ._prompts import Prompt, _prompts
from ._tools import apply_tools

__all__ = ["Context", "generate_parallel"]


class Context:
    """A llama.cpp context with ``n_parallel`` slots over one model.

    ``n_ctx_per_seq`` is what ONE prompt plus its generation may use; the KV cache holds
    ``n_parallel x n_ctx_per_seq`` positions. ``n_batch`` caps the tokens of one decode call;
    longer prompts are fed in chunks. Its default is the larger of ``n_parallel`` and 512,
    or 2048 when any layer runs on a GPU, where fewer, larger prompt batches were measured
    faster (docs/performance.md); llama.cpp's physical batch is ``n_batch`` up to that size.
    ``n_threads=None`` uses one thread per CPU this process may use: its affinity mask
    (``taskset``), limited by its cgroup's CPU quota (a container's ``--cpus``). Calls on one context from
    several threads take turns; separate contexts of one model run in parallel.
    ``device_sampling``: ``True`` cuts every row of logits down to its best candidates
    (64 blocks of up to 128 logits) inside llama.cpp's graph, on the device that runs the
    output layer, and each sequence's chain picks from those on the host: the token the
    whole row gives, for greedy and top-k (up to 64) chains without penalties; prompts
    with ``logprobs``, penalties or other top-k get whole rows. ``False`` copies whole rows
    back and samples on the host, many sequences at once. ``None`` (default) is auto:
    ``True`` with the output layer on a GPU and at least 8 slots (measured faster there,
    docs/performance.md), else ``False``.
    ``share_prefixes`` (default ``True``): prompts that begin with the same 16 tokens or
    more decode that common prefix once; the other slots copy it from the first one's KV
    cache (``n_prompt_tokens_shared`` in the completions and statistics counts them).
    ``warmup``: ``True`` runs a few call-shaped decodes at creation and removes what they
    left in every slot, so that the first call does not pay for the device's first use of
    this context; ``False`` skips them; ``None`` (default) is auto: ``True`` when any layer
    runs on a GPU (where a first call was measured slower than later ones), else ``False``.
    ``type_k``, ``type_v``: the KV cache's element types, ``"f16"`` (default), ``"bf16"``,
    ``"f32"``, ``"q8_0"`` or ``"q4_0"``. ``"q8_0"`` holds about 1.9x the positions of
    ``"f16"`` in the same memory and ``"q4_0"`` about 3.6x, at a small cost in perplexity
    (docs/performance.md, "KV-cache types"); a quantized V cache turns flash attention on.
    ``prefix_cache_mib``: the prefix cache. On (``-1``, or a budget in MiB), a prompt that
    ends normally leaves its KV cache (prompt and generated tokens) in its slot, across calls;
    a later prompt that starts with the same 16 tokens or more takes the slot holding the
    longest such prefix and decodes only the rest (``n_prompt_tokens_cached`` counts what it
    reused): a chat's next turn decodes its new message only. When a slot is needed for
    another prompt, what it held moves to host memory, up to this many MiB (``-1``: a
    quarter of the memory available when the context is made, at most 8192), least recently
    used first out. ``0`` (default) is off: every prompt's KV is removed when it ends. The
    cache reuses only identical tokens from position 0, but a reused prefix was computed in
    other batch shapes than a fresh decode, which llama.cpp's CPU kernels round differently:
    a greedy output can part from the cache-off one where two tokens are nearly tied, so
    with the cache on a call's output may depend on the calls before it.
    ``prefix_cache_dir``: a folder that keeps the cache across restarts (needs it on). It is
    written when the context is freed, an Engine closes, or on ``save_prefix_cache()``, and
    read back, within the budget, by a context of the same model file, KV types and fastpar
    and llama.cpp builds; a file made by anything else is refused, never loaded
    (``prefix_cache_stats().n_refused``).
    ``embeddings``: ``True`` makes a context for ``fastpar.embed`` instead of generation (it
    generates nothing; a generation context embeds nothing). Each text is decoded whole in
    one batch, so a text may have up to ``n_batch`` tokens (and ``n_ctx_per_seq``, and the
    model's training context), whose default there is ``n_ctx_per_seq`` (or the training
    context if less); with one KV buffer for all slots. ``pooling``: how a text's
    token vectors become one, ``"mean"``, ``"cls"`` (the first token's), ``"last"``, or
    ``"rank"`` (a reranker's relevance score, for ``fastpar.rerank``); ``None`` (default)
    takes the model's own (its GGUF's pooling type), or ``"mean"`` when the model names
    none (a model made for generation).
    """

    @_keywords_checked
    def __init__(self, model: Model, *, n_parallel: int = _CONTEXT_DEFAULTS.n_parallel,
                 n_ctx_per_seq: int = _CONTEXT_DEFAULTS.n_ctx_per_seq, n_batch: Optional[int] = None,
                 n_threads: Optional[int] = None, kv_unified: bool = _CONTEXT_DEFAULTS.kv_unified,
                 device_sampling: Optional[bool] = None,
                 share_prefixes: bool = _CONTEXT_DEFAULTS.share_prefixes,
                 warmup: Optional[bool] = None, type_k: str = _CONTEXT_DEFAULTS.type_k,
                 type_v: str = _CONTEXT_DEFAULTS.type_v, prefix_cache_mib: int = _CONTEXT_DEFAULTS.prefix_cache_mib,
                 prefix_cache_dir: Optional[Union[str, "os.PathLike[str]"]] = None,
                 embeddings: bool = _CONTEXT_DEFAULTS.embeddings, pooling: Optional[str] = None) -> None:
        if not isinstance(model, Model):
            raise TypeError(f"model must be a fastpar.Model, got {type(model).__name__}")
        params = _context_params(n_parallel, n_ctx_per_seq, n_batch, n_threads, kv_unified, device_sampling,
                                 share_prefixes, warmup, type_k, type_v, prefix_cache_mib, prefix_cache_dir,
                                 embeddings, pooling)
        self.model = model
        self._ctx = _core.Context(model._model, params)

    @property
    def n_parallel(self) -> int:
        return self._ctx.n_parallel

    @property
    def n_ctx_per_seq(self) -> int:
        return self._ctx.n_ctx_per_seq

    @property
    def n_batch(self) -> int:
        return self._ctx.n_batch

    @property
    def n_threads(self) -> int:
        return self._ctx.n_threads

    @property
    def device_sampling(self) -> bool:
        """Whether rows of logits are cut down on the device (``device_sampling`` above)."""
        return self._ctx.device_sampling

    @property
    def share_prefixes(self) -> bool:
        return self._ctx.share_prefixes

    @property
    def type_k(self) -> str:
        return self._ctx.type_k

    @property
    def type_v(self) -> str:
        return self._ctx.type_v

    @property
    def embeddings(self) -> bool:
        """Whether this context was made for ``fastpar.embed`` (``embeddings`` above)."""
        return self._ctx.embeddings

    @property
    def pooling(self) -> Optional[str]:
        """An embeddings context's pooling as used: ``"mean"``, ``"cls"``, ``"last"`` or
        ``"rank"`` (``None`` for generation)."""
        return self._ctx.pooling or None

    @property
    def embedding_size(self) -> int:
        """The length of the model's embedding vectors (with ``"rank"`` pooling, of its
        classification head's outputs, the relevance score first)."""
        return self._ctx.embedding_size

    @property
    def warmed_up(self) -> bool:
        """Whether creation ran the warm-up decodes (``warmup`` above)."""
        return self._ctx.warmed_up

    @property
    def last_stats(self) -> _core.Stats:
        """Statistics of the last ``generate_parallel`` call on this context (zeros before any)."""
        return self._ctx.last_stats

    @property
    def prefix_cache_mib(self) -> int:
        """The prefix cache's option as given: -1 auto, 0 off, else MiB of host memory."""
        return self._ctx.prefix_cache_mib

    def prefix_cache_stats(self) -> _core.PrefixCacheStats:
        """What the prefix cache holds (slots, host entries and their bytes, the budget) and
        did (hits, tokens reused, sequences saved, restored and evicted) since creation."""
        return self._ctx.prefix_cache_stats()

    @property
    def prefix_cache_dir(self) -> Optional[str]:
        return self._ctx.prefix_cache_dir or None

    def clear_prefix_cache(self) -> None:
        """Empty the prefix cache: every slot's KV, every host entry, and its files in
        ``prefix_cache_dir`` (waits for a running call)."""
        self._ctx.clear_prefix_cache()

    def save_prefix_cache(self) -> None:
        """Write the prefix cache to ``prefix_cache_dir`` now (also done when the context is freed)."""
        self._ctx.save_prefix_cache()

    def kv_seq_pos_max(self) -> List[int]:
        """Highest KV position each slot holds; -1 = empty. Between calls a slot holds what
        the prefix cache keeps (all -1 with ``prefix_cache_mib=0`` or after ``clear_prefix_cache()``)."""
        return self._ctx.seq_pos_max()

    def __repr__(self) -> str:
        return (f"fastpar.Context(n_parallel={self.n_parallel}, n_ctx_per_seq={self.n_ctx_per_seq}, "
                f"n_batch={self.n_batch}, n_threads={self.n_threads})")


@_keywords_checked
@_with_options
def generate_parallel(
    ctx: Context,
    prompts: Sequence[Prompt],
    params: Union[None, SamplingParams, Sequence[SamplingParams]] = None,
    *,
    progress: bool = False,
    on_completion: Optional[Callable[[int, Any], None]] = None,
    **generation_params,
) -> Union[List[_core.Completion], List[List[_core.Completion]]]:
    """Generate a completion for every prompt in one unified batch; results in input order.

    ``prompts`` is a sequence (list, tuple, 1-D numpy array, ...); a prompt is a ``str``
    (raw text; special tokens in it are parsed), a list of
    ``{"role": ..., "content": ...}`` messages rendered with the model's chat template, or
    a list of token ids fed as they are (an id outside the vocabulary fails that prompt).
    Every prompt gets its own sequence, sampler and KV cells: its output does not depend
    on its batch-mates. More prompts than ``ctx.n_parallel`` are queued and fill slots
    as they free up.

    ``params``: one ``fastpar.SamplingParams`` for every prompt, or a sequence of them,
    one per prompt (same length as ``prompts``: else ``ValueError``). The keyword options
    are shorthand for one ``SamplingParams`` (``max_tokens``, ``temperature`` (0 =
    greedy), ``top_k``, ``top_p``, ``min_p``, ``repeat_penalty``, ``presence_penalty``,
    ``frequency_penalty``, ``repeat_last_n``, ``seed``, ``stop``, ``ignore_eos``,
    ``logprobs``, ``top_logprobs``, ``n``, ``json_schema``, ``grammar``, ``prompt_logprobs``,
    ``tools``, ``tool_choice``, ...: ``SamplingParams``' fields; defaults from the
    core's ``GenerateParams``); ``params`` and keyword options together are a
    ``TypeError``. ``seed=None`` draws one random seed per ``SamplingParams`` given: with
    one for all prompts, every prompt gets the same seed (so a prompt's output does not
    depend on its position).

    Returns a list of ``Completion``, one per prompt. If any prompt has ``n > 1``, it
    returns a list of lists instead: one list per prompt, holding its ``n`` samples in
    order (sample j was seeded ``seed + j``; a prompt with ``n == 1`` gets a list of one).

    ``progress=True`` shows a progress bar (prompts done; at the end, the call's generated tokens
    per second, ``last_stats.gen_tokens_per_s``);
    ``on_completion(index, result)`` is called as each prompt finishes, on the calling
    thread, with what the returned list holds at ``index`` (a ``Completion``, or the list
    of its samples once all have finished). An exception from it cancels the rest of the
    call and propagates.

    A prompt that cannot be served (too long for ``n_ctx_per_seq``, empty after
    tokenization, ...) gets ``finish_reason == "error"`` and a message in ``error``;
    the others complete normally. Bad arguments raise ``TypeError``/``ValueError``
    before any work: an unknown option (with the closest known one), text that is not
    valid Unicode (a lone surrogate; naming the prompt's index). The GIL is released while generating; Ctrl-C cancels the call
    and leaves the context clean.
    """
    if not isinstance(ctx, Context):
        raise TypeError(f"ctx must be a fastpar.Context, got {type(ctx).__name__}")
    if isinstance(prompts, (str, bytes, bytearray)) or not isinstance(prompts, Sized):
        _prompts(prompts)  # its TypeError
    plist = _params_list("generate_parallel", params, generation_params, len(prompts))
    if any(sp.tools is not None for sp in plist):
        rendered, core_params = apply_tools(ctx.model._model, list(prompts), plist)
        converted = _prompts(rendered)
    else:
        converted = _prompts(prompts)
        core_params = [p._params for p in plist]
    if on_completion is not None and not callable(on_completion):
        raise TypeError("on_completion must be callable")
    counts = [plist[0 if len(plist) == 1 else i].n for i in range(len(converted))]
    if all(n == 1 for n in counts):
        if not progress:
            return ctx._ctx.generate(converted, core_params, on_completion)
        return _generate_with_progress(ctx, converted, core_params, on_completion)

    # n > 1 somewhere: the core returns every sample flat, prompt after prompt; group them
    # per prompt, and call back once a prompt's samples are all in.
    owner = [i for i, n in enumerate(counts) for _ in range(n)]
    first = [0] * len(counts)
    for i in range(1, len(counts)):
        first[i] = first[i - 1] + counts[i - 1]
    samples: List[List[Any]] = [[None] * n for n in counts]
    left = list(counts)

    def collect(k: int, completion: _core.Completion) -> None:
        i = owner[k]
        samples[i][k - first[i]] = completion
        left[i] -= 1
        if left[i] == 0 and on_completion is not None:
            on_completion(i, list(samples[i]))

    if progress:
        flat = _generate_with_progress(ctx, converted, core_params, collect, total=len(converted),
                                       count=lambda k: left[owner[k]] == 0)
    else:
        flat = ctx._ctx.generate(converted, core_params, collect)
    return [flat[first[i]:first[i] + counts[i]] for i in range(len(counts))]


def _generate_with_progress(ctx: Context, prompts: list, params: List[_core.GenerateParams],
                            on_completion: Optional[Callable[[int, _core.Completion], None]],
                            total: Optional[int] = None, count: Optional[Callable[[int], bool]] = None):
    from tqdm.auto import tqdm

    # The bar counts prompts as they finish; the rate it ends with is the call's own
    # ``last_stats.gen_tokens_per_s`` (generated tokens per second of generation steps),
    # known only once the call is done: a rate over wall time would count prompt
    # processing and the wait for the first completions, and disagree with the stats.
    # With samples (n > 1), `count(k)` says whether result k finished its prompt.
    with tqdm(total=len(prompts) if total is None else total, unit="prompt", desc="fastpar") as bar:
        def update(i: int, completion: _core.Completion) -> None:
            if on_completion is not None:
                on_completion(i, completion)
            if count is None or count(i):
                bar.update(1)

        results = ctx._ctx.generate(prompts, params, update)
        bar.set_postfix_str(f"{ctx.last_stats.gen_tokens_per_s:.1f} gen tok/s")
        return results
