"""The Python surface: argument checking and conversion, then one call into the core.

Every default below is read from the C++ option structs (``_core.*Params()``), the one
source of truth; nothing here retypes a default value.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import json
import math
import os
import typing
from collections.abc import Mapping, Sequence
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from . import _core, _openmp

__all__ = ["Model", "Context", "SamplingParams", "generate_parallel", "Prompt"]

_MODEL_DEFAULTS = _core.ModelParams()
_CONTEXT_DEFAULTS = _core.ContextParams()
_GENERATE_DEFAULTS = _core.GenerateParams()

Message = Mapping[str, str]
Prompt = Union[str, Sequence[Message]]


def _int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    return value


def _float(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value}")
    return value


def _bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


class Model:
    """A GGUF model loaded with llama.cpp; share one between several contexts.

    Raises ``FileNotFoundError`` for a missing file, ``fastpar.ModelLoadError`` for a file
    llama.cpp cannot load (truncated, not GGUF, unsupported architecture), ``ValueError``
    for bad options (e.g. GPU layers in a CPU-only build).
    """

    def __init__(self, path: Union[str, os.PathLike], *, n_gpu_layers: int = _MODEL_DEFAULTS.n_gpu_layers,
                 use_mmap: bool = _MODEL_DEFAULTS.use_mmap) -> None:
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
        params = _core.ModelParams()
        params.n_gpu_layers = _int("n_gpu_layers", n_gpu_layers)
        params.use_mmap = _bool("use_mmap", use_mmap)
        self._model = _core.Model(os.fspath(path), params)
        _openmp.settled()  # llama.cpp's CPU backend has started

    @property
    def path(self) -> str:
        return self._model.path

    @property
    def n_vocab(self) -> int:
        return self._model.n_vocab

    @property
    def n_ctx_train(self) -> int:
        return self._model.n_ctx_train

    @property
    def description(self) -> str:
        return self._model.description

    def tokenize(self, text: str) -> List[int]:
        """Token ids of ``text`` as generation feeds them (BOS rules applied, special tokens parsed)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return self._model.tokenize(text)

    def apply_chat_template(self, messages: Sequence[Message]) -> str:
        """``messages`` rendered with the model's own chat template, assistant turn opened."""
        return self._model.apply_chat_template(_messages(messages, "messages"))

    def __repr__(self) -> str:
        return f"fastpar.Model({self.path!r}, {self.description!r})"


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
    """

    def __init__(self, model: Model, *, n_parallel: int = _CONTEXT_DEFAULTS.n_parallel,
                 n_ctx_per_seq: int = _CONTEXT_DEFAULTS.n_ctx_per_seq, n_batch: Optional[int] = None,
                 n_threads: Optional[int] = None, kv_unified: bool = _CONTEXT_DEFAULTS.kv_unified,
                 device_sampling: Optional[bool] = None,
                 share_prefixes: bool = _CONTEXT_DEFAULTS.share_prefixes,
                 warmup: Optional[bool] = None) -> None:
        if not isinstance(model, Model):
            raise TypeError(f"model must be a fastpar.Model, got {type(model).__name__}")
        params = _context_params(n_parallel, n_ctx_per_seq, n_batch, n_threads, kv_unified, device_sampling,
                                 share_prefixes, warmup)
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
    def warmed_up(self) -> bool:
        """Whether creation ran the warm-up decodes (``warmup`` above)."""
        return self._ctx.warmed_up

    @property
    def last_stats(self) -> _core.Stats:
        """Statistics of the last ``generate_parallel`` call on this context (zeros before any)."""
        return self._ctx.last_stats

    def kv_seq_pos_max(self) -> List[int]:
        """Highest KV position each slot holds; all ``-1`` between calls."""
        return self._ctx.seq_pos_max()

    def __repr__(self) -> str:
        return (f"fastpar.Context(n_parallel={self.n_parallel}, n_ctx_per_seq={self.n_ctx_per_seq}, "
                f"n_batch={self.n_batch}, n_threads={self.n_threads})")


def _context_params(n_parallel: object, n_ctx_per_seq: object, n_batch: object, n_threads: object,
                    kv_unified: object, device_sampling: object = None,
                    share_prefixes: object = _CONTEXT_DEFAULTS.share_prefixes,
                    warmup: object = None) -> _core.ContextParams:
    params = _core.ContextParams()
    params.n_parallel = _int("n_parallel", n_parallel)
    params.n_ctx_per_seq = _int("n_ctx_per_seq", n_ctx_per_seq)
    params.n_batch = _CONTEXT_DEFAULTS.n_batch if n_batch is None else _int("n_batch", n_batch)
    if n_batch is not None and params.n_batch < 1:
        raise ValueError(f"n_batch must be positive (or None for the default), got {n_batch}")
    if n_threads is not None and _int("n_threads", n_threads) < 1:
        raise ValueError(f"n_threads must be positive (or None for one per CPU this process may use), got {n_threads}")
    params.n_threads = _CONTEXT_DEFAULTS.n_threads if n_threads is None else n_threads
    params.kv_unified = _bool("kv_unified", kv_unified)
    params.device_sampling = -1 if device_sampling is None else int(_bool("device_sampling", device_sampling))
    params.share_prefixes = _bool("share_prefixes", share_prefixes)
    params.warmup = -1 if warmup is None else int(_bool("warmup", warmup))
    return params


def _text(text: str, where: str) -> str:
    # pybind11 cannot turn a lone surrogate (from surrogateescape decoding, or a bad
    # "\ud800" literal) into UTF-8 and would refuse the whole call with a message that
    # names no argument. An ASCII str (isascii() is O(1)) cannot hold one.
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"{where} is not valid text: it holds a lone surrogate "
                             f"{text[e.start]!r} at index {e.start}; fix or drop it "
                             f"(e.g. .encode('utf-8', 'replace').decode())") from None
    return str(text)  # a str subclass (numpy.str_) as a plain str


def _messages(messages: object, where: str) -> List[_core.ChatMessage]:
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise TypeError(f"{where} must be a list of {{'role', 'content'}} dicts")
    out = []
    for j, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise TypeError(f"{where}[{j}] must be a dict with str 'role' and 'content', got {m!r}")
        out.append(_core.ChatMessage(_text(m["role"], f"{where}[{j}]['role']"),
                                     _text(m["content"], f"{where}[{j}]['content']")))
    return out


def _prompt(prompt: object, where: str):
    if isinstance(prompt, str):
        return _text(prompt, where)
    if isinstance(prompt, Sequence) and not isinstance(prompt, (bytes, bytearray)):
        return _messages(prompt, where)
    raise TypeError(f"{where} must be a str or a list of chat messages, got {type(prompt).__name__}")


def _prompts(prompts: object) -> list:
    # Any sized, indexable collection in order: list, tuple, 1-D numpy array of str (not a
    # registered Sequence). Not a lone str, whose characters would each become a prompt.
    bad = isinstance(prompts, (str, bytes, bytearray, Mapping))
    if not bad and not isinstance(prompts, Sequence):
        bad = not (hasattr(prompts, "__len__") and hasattr(prompts, "__getitem__")) or getattr(prompts, "ndim", 1) != 1
    if bad:
        raise TypeError("prompts must be a sequence of str (or of chat-message lists), "
                        f"got {type(prompts).__name__}")
    return [_prompt(p, f"prompts[{i}]") for i, p in enumerate(prompts)]


def _f32(value: float) -> float:
    """A float32 default as the number it was written as (0.8, not 0.800000011920929)."""
    return float(f"{value:.7g}")


def _default(name: str) -> Any:
    """The core's default of the generation option ``name`` (``GenerateParams``)."""
    value = getattr(_GENERATE_DEFAULTS, name)
    return _f32(value) if isinstance(value, float) else value


def _with_options(func: Callable) -> Callable:
    """Shows the generation options in ``func``'s signature (help(), inspect) in place of
    its ``**options``; the function itself still takes them as keywords."""
    sig = inspect.signature(func)
    params = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    options = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=kind)
               for name, (default, kind) in _OPTIONS.items()]
    func.__signature__ = sig.replace(parameters=params + options)
    return func


def _check_names(call: str, options: Dict[str, Any]) -> None:
    unknown = [name for name in options if name not in _OPTIONS]
    if unknown:
        name = unknown[0]
        close = difflib.get_close_matches(name, _OPTIONS, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else f"; the options are {', '.join(_OPTIONS)}"
        raise TypeError(f"{call}() got an unexpected keyword argument '{name}'{hint}")


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """Every generation option of one prompt, checked once, immutable (``dataclasses.replace``
    makes a changed copy). Defaults come from the core's ``GenerateParams``.

    ``max_tokens``, ``temperature`` (0 = greedy), ``top_k``, ``top_p``, ``min_p``,
    ``repeat_penalty``, ``presence_penalty``, ``frequency_penalty``, ``repeat_last_n``,
    ``seed`` (None = random), ``stop`` (a str or a sequence of str; kept as a tuple),
    ``ignore_eos``, ``logprobs`` (each generated token's log-probability),
    ``top_logprobs`` (0-20: the k most likely tokens at each generated position),
    ``n`` (samples of the prompt: decoded once, sample j seeded ``seed + j``),
    ``json_schema`` (a dict or a JSON string, kept as JSON text: every output validates
    against it) and ``grammar`` (GBNF text every output matches); not both.
    ``prompt_logprobs``: each prompt token's log-probability given the tokens before it, in
    ``Completion.prompt_logprobs`` (None for the first token; ``prompt_token_ids`` and
    ``prompt_greedy`` beside it; with ``top_logprobs`` also ``prompt_top_logprobs``).

    Raises ``TypeError`` for a wrong type and ``ValueError`` for a value out of range, here.
    """

    max_tokens: int = _default("max_tokens")
    temperature: float = _default("temperature")
    top_k: int = _default("top_k")
    top_p: float = _default("top_p")
    min_p: float = _default("min_p")
    repeat_penalty: float = _default("repeat_penalty")
    presence_penalty: float = _default("presence_penalty")
    frequency_penalty: float = _default("frequency_penalty")
    repeat_last_n: int = _default("repeat_last_n")
    seed: Optional[int] = None
    stop: Union[None, str, Tuple[str, ...]] = None
    ignore_eos: bool = _default("ignore_eos")
    logprobs: bool = _default("logprobs")
    top_logprobs: int = _default("top_logprobs")
    n: int = _default("n")
    json_schema: Optional[str] = None
    grammar: Optional[str] = None
    prompt_logprobs: bool = _default("prompt_logprobs")

    def __post_init__(self) -> None:
        stop = self.stop
        if stop is not None and not isinstance(stop, str):
            if not isinstance(stop, Sequence) or not all(isinstance(x, str) for x in stop):
                raise TypeError("stop must be a str or a list of str")
            object.__setattr__(self, "stop", tuple(stop))
        schema = self.json_schema
        if schema is not None:
            if isinstance(schema, Mapping):
                try:
                    schema = json.dumps(schema)
                except (TypeError, ValueError) as e:
                    raise TypeError(f"json_schema is not JSON-serialisable: {e}") from None
            elif isinstance(schema, str):
                try:
                    json.loads(schema)
                except ValueError as e:
                    raise ValueError(f"json_schema is not valid JSON: {e}") from None
            else:
                raise TypeError(f"json_schema must be a dict or a JSON str, got {type(schema).__name__}")
            object.__setattr__(self, "json_schema", schema)
        if self.grammar is not None:
            if not isinstance(self.grammar, str):
                raise TypeError(f"grammar must be a str of GBNF or None, got {type(self.grammar).__name__}")
            if not self.grammar.strip():
                raise ValueError("grammar is empty; pass None for no grammar")
        if self.json_schema is not None and self.grammar is not None:
            raise ValueError("json_schema and grammar were both given; a prompt takes one constraint")
        object.__setattr__(self, "_params", _to_core(self))

    @classmethod
    def _from_options(cls, call: str, options: Dict[str, Any]) -> "SamplingParams":
        _check_names(call, options)
        return cls(**options)


#: How each plain option is checked, by the type of the core's field; the options that are
#: not a plain number or bool are converted by name in _to_core.
_CHECKS = {bool: _bool, int: _int, float: _float}


def _to_core(sp: SamplingParams) -> _core.GenerateParams:
    params = _core.GenerateParams()
    for field in dataclasses.fields(SamplingParams):  # in order: the first bad option is named
        name, value = field.name, getattr(sp, field.name)
        if name == "seed":
            if value is not None:
                seed = _int("seed", value)
                if not 0 <= seed < 2**32:
                    raise ValueError(f"seed must be in [0, 2**32) or None, got {seed}")
                params.seed = seed
        elif name == "stop":
            if value is not None:
                stops = [value] if isinstance(value, str) else value
                params.stop = [_text(s, "stop") for s in stops]
        elif name in ("json_schema", "grammar"):
            if value is not None:
                setattr(params, name, _text(value, name))
        else:
            setattr(params, name, _CHECKS[type(getattr(_GENERATE_DEFAULTS, name))](name, value))
    params.validate()  # ranges, from the core: ValueError naming the option
    return params


#: The generation options every entry point takes as keywords: SamplingParams' fields, with
#: their defaults and, for signatures and help(), the types a keyword accepts (stop and
#: json_schema take more than the field keeps).
_KEYWORD_TYPES = {"stop": Union[None, str, Sequence[str]], "json_schema": Union[None, str, Mapping[str, Any]]}
_HINTS = typing.get_type_hints(SamplingParams)
_OPTIONS = {field.name: (field.default, _KEYWORD_TYPES.get(field.name, _HINTS[field.name]))
            for field in dataclasses.fields(SamplingParams)}


def _generate_params(call: str, options: Dict[str, Any]) -> _core.GenerateParams:
    """The generation options, checked, as the core's struct (shared by every entry point).
    ``call`` names the public function in errors."""
    return SamplingParams._from_options(call, options)._params


def _params_list(call: str, params: object, options: Dict[str, Any], n_prompts: int) -> List[SamplingParams]:
    """``params`` (one SamplingParams, one per prompt, or None) or the keyword options, as
    a list of one entry for all prompts or one per prompt."""
    if params is None:
        return [SamplingParams._from_options(call, options)]
    if options:
        raise TypeError(f"{call}() takes params= or keyword options, not both (got params and "
                        f"{', '.join(repr(k) for k in options)}); use dataclasses.replace(params, ...)")
    if isinstance(params, SamplingParams):
        return [params]
    if isinstance(params, (str, bytes, Mapping)) or not isinstance(params, Sequence):
        raise TypeError(f"params must be a fastpar.SamplingParams or a sequence of them, one per prompt, "
                        f"got {type(params).__name__}")
    out = list(params)
    for i, p in enumerate(out):
        if not isinstance(p, SamplingParams):
            raise TypeError(f"params[{i}] must be a fastpar.SamplingParams, got {type(p).__name__}")
    if len(out) != n_prompts:
        raise ValueError(f"params holds {len(out)} SamplingParams for {n_prompts} prompts; "
                         "pass one per prompt, or a single SamplingParams for all")
    return out


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
    (raw text; special tokens in it are parsed) or a list of
    ``{"role": ..., "content": ...}`` messages rendered with the model's chat template.
    Every prompt gets its own sequence, sampler and KV cells: its output does not depend
    on its batch-mates. More prompts than ``ctx.n_parallel`` are queued and fill slots
    as they free up.

    ``params``: one ``fastpar.SamplingParams`` for every prompt, or a sequence of them,
    one per prompt (same length as ``prompts``: else ``ValueError``). The keyword options
    are shorthand for one ``SamplingParams`` (``max_tokens``, ``temperature`` (0 =
    greedy), ``top_k``, ``top_p``, ``min_p``, ``repeat_penalty``, ``presence_penalty``,
    ``frequency_penalty``, ``repeat_last_n``, ``seed``, ``stop``, ``ignore_eos``,
    ``logprobs``, ``top_logprobs``, ``n``, ``json_schema``, ``grammar``, ``prompt_logprobs``; defaults from the
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
    converted = _prompts(prompts)
    plist = _params_list("generate_parallel", params, generation_params, len(converted))
    if on_completion is not None and not callable(on_completion):
        raise TypeError("on_completion must be callable")
    core_params = [p._params for p in plist]
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
