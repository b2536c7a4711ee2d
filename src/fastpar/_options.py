"""Generation and context options: their checks, their defaults and ``SamplingParams``.

Every default below is read from the C++ option structs (``_core.*Params()``), the one
source of truth; nothing here retypes a default value.
"""

from __future__ import annotations

import dataclasses
import os
import difflib
import functools
import inspect
import json
import math
import typing
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from . import _core
from ._prompts import _text

__all__ = ["SamplingParams"]

_MODEL_DEFAULTS = _core.ModelParams()
_CONTEXT_DEFAULTS = _core.ContextParams()
_GENERATE_DEFAULTS = _core.GenerateParams()


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


def _set(params: Any, name: str, value: Any) -> None:
    """``params.name = value``; an int too large for the core's 32-bit field is a
    ``ValueError`` naming the option and its range (the core's own rule where it has one)."""
    try:
        setattr(params, name, value)
    except TypeError:
        if not isinstance(value, int):
            raise
        bound = 2**31 - 1 if value > 0 else -2**31
        rule = f"{name} must be {'at most' if value > 0 else 'at least'} {bound}"
        if hasattr(params, "validate"):
            probe = type(params)()
            setattr(probe, name, bound)
            try:
                probe.validate()
            except ValueError as e:  # the core's range, e.g. "top_k must be >= 0 (0 = off)"
                rule = str(e).rsplit(", got", 1)[0]
        raise ValueError(f"{rule}, got {value}") from None


def _context_params(n_parallel: object, n_ctx_per_seq: object, n_batch: object, n_threads: object,
                    kv_unified: object, device_sampling: object = None,
                    share_prefixes: object = _CONTEXT_DEFAULTS.share_prefixes,
                    warmup: object = None, type_k: object = _CONTEXT_DEFAULTS.type_k,
                    type_v: object = _CONTEXT_DEFAULTS.type_v,
                    prefix_cache_mib: object = _CONTEXT_DEFAULTS.prefix_cache_mib,
                    prefix_cache_dir: object = None, embeddings: object = _CONTEXT_DEFAULTS.embeddings,
                    pooling: object = None) -> _core.ContextParams:
    params = _core.ContextParams()
    _set(params, "n_parallel", _int("n_parallel", n_parallel))
    _set(params, "n_ctx_per_seq", _int("n_ctx_per_seq", n_ctx_per_seq))
    if n_batch is not None and _int("n_batch", n_batch) < 1:
        raise ValueError(f"n_batch must be positive (or None for the default), got {n_batch}")
    _set(params, "n_batch", _CONTEXT_DEFAULTS.n_batch if n_batch is None else n_batch)
    if n_threads is not None and _int("n_threads", n_threads) < 1:
        raise ValueError(f"n_threads must be positive (or None for one per CPU this process may use), got {n_threads}")
    _set(params, "n_threads", _CONTEXT_DEFAULTS.n_threads if n_threads is None else n_threads)
    params.kv_unified = _bool("kv_unified", kv_unified)
    params.device_sampling = -1 if device_sampling is None else int(_bool("device_sampling", device_sampling))
    params.share_prefixes = _bool("share_prefixes", share_prefixes)
    params.warmup = -1 if warmup is None else int(_bool("warmup", warmup))
    for name, value in (("type_k", type_k), ("type_v", type_v)):
        if not isinstance(value, str):
            raise TypeError(f"{name} must be a str such as 'q8_0', got {type(value).__name__}")
        setattr(params, name, value)
    _set(params, "prefix_cache_mib", _int("prefix_cache_mib", prefix_cache_mib))
    if prefix_cache_dir is not None:
        if not isinstance(prefix_cache_dir, (str, os.PathLike)):
            raise TypeError(f"prefix_cache_dir must be a folder's path (str or os.PathLike), "
                            f"got {type(prefix_cache_dir).__name__}")
        params.prefix_cache_dir = os.fspath(prefix_cache_dir)
    params.embeddings = _bool("embeddings", embeddings)
    if pooling is not None:
        if not isinstance(pooling, str):
            raise TypeError(f"pooling must be a str such as 'mean', got {type(pooling).__name__}")
        params.pooling = pooling
    params.validate()  # ranges, from the core: ValueError naming the option
    return params


def _model_params(n_gpu_layers: object, use_mmap: object) -> _core.ModelParams:
    params = _core.ModelParams()
    _set(params, "n_gpu_layers", _int("n_gpu_layers", n_gpu_layers))
    params.use_mmap = _bool("use_mmap", use_mmap)
    params.validate()
    return params


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


def _unknown_keyword(call: str, name: str, known: Sequence[str], listed: Sequence[str]) -> TypeError:
    """Python's own error for an unknown keyword, with the closest known name: one that
    begins with it (``n_ctx`` -> ``n_ctx_per_seq``), else a near spelling among ``listed``
    (the generation options, for a call that takes them); else the ``listed`` names."""
    close = [k for k in known if len(name) >= 3 and k.startswith(name)][:1]
    close = close or difflib.get_close_matches(name, listed, n=1)
    hint = f"; did you mean '{close[0]}'?" if close else f"; the options are {', '.join(listed)}"
    return TypeError(f"{call}() got an unexpected keyword argument '{name}'{hint}")


def _check_names(call: str, options: Dict[str, Any]) -> None:
    for name in options:
        if name not in _OPTIONS:
            raise _unknown_keyword(call, name, list(_OPTIONS), list(_OPTIONS))


def _keywords_checked(func: Callable) -> Callable:
    """Gives ``func`` (a public function, method or ``__init__``) the help that the
    generation options have: an unknown keyword is a ``TypeError`` naming the closest
    known one, raised before any work."""
    sig = inspect.signature(func)
    known = [name for name, p in sig.parameters.items() if name != "self" and
             p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
    # A function that takes the generation options lists those when nothing is close.
    listed = list(_OPTIONS) if set(_OPTIONS) <= set(known) else known
    accepted = frozenset(known)
    name = func.__qualname__
    call = name[:-len(".__init__")] if name.endswith(".__init__") else name

    @functools.wraps(func)
    def checked(*args: Any, **kwargs: Any) -> Any:
        for key in kwargs:
            if key not in accepted:
                raise _unknown_keyword(call, key, known, listed)
        return func(*args, **kwargs)

    return checked


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
    against it), ``grammar`` (GBNF text every output matches), ``choice`` (a sequence of
    non-empty str, kept as a tuple: every output is exactly one of them) and ``regex`` (a
    regular expression every output matches whole, as ``re.fullmatch``); one of the four.
    ``logit_bias``: a mapping of token id (an int, or its decimal str as in OpenAI's JSON) to
    a number added to that token's logit before sampling; ``-math.inf`` bans the token
    (kept as a tuple of (id, bias) pairs in id order).
    ``allowed_token_ids``: a sequence of token ids (kept as a sorted tuple), the only tokens
    generated; the output ends early only if an end-of-generation token is among them (ban
    tokens with ``logit_bias`` of ``-math.inf``).
    ``reasoning`` (thinking models' ``<think>...</think>``): ``"split"`` puts the thought
    the output opens with (or continues, when the prompt opened one) in
    ``Completion.reasoning`` and the answer after it in ``text``, and the constraints apply
    to the answer alone; ``"off"`` closes an empty thought after a chat prompt, so the model
    answers at once; None leaves the output as it is.
    ``priority``: which queued prompt takes a free slot first, the lowest value (first come
    first served among equals); one more urgent than a running prompt suspends the least
    urgent running one, which resumes where it stopped once a slot is free.
    ``tools``: OpenAI's list of functions (``{"type": "function", "function": {"name",
    "description", "parameters"}}``; kept as JSON text) the model may call; the prompt must
    be chat messages, rendered with the model's Jinja template, and ``Completion.tool_calls``
    holds the calls (``finish_reason`` ``"tool_calls"``). ``tool_choice``: ``"auto"`` (the
    default), ``"none"``, ``"required"`` or a function's name (or OpenAI's
    ``{"type": "function", "function": {"name": ...}}``); required and named calls are
    constrained by the function's parameters. ``parallel_tool_calls``: allow several calls.
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
    choice: Optional[Tuple[str, ...]] = None
    logit_bias: Optional[Tuple[Tuple[int, float], ...]] = None
    priority: int = _default("priority")
    regex: Optional[str] = None
    allowed_token_ids: Optional[Tuple[int, ...]] = None
    reasoning: Optional[str] = None
    prompt_logprobs: bool = _default("prompt_logprobs")
    tools: Optional[str] = None
    tool_choice: Optional[str] = None
    parallel_tool_calls: bool = False

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
        for name, what in (("grammar", "a str of GBNF"), ("regex", "a str (a regular expression)")):
            value = getattr(self, name)
            if value is not None:
                if not isinstance(value, str):
                    raise TypeError(f"{name} must be {what} or None, got {type(value).__name__}")
                if not value.strip():
                    raise ValueError(f"{name} is empty; pass None for no {name}")
        choice = self.choice
        if choice is not None:
            if isinstance(choice, str) or not isinstance(choice, Sequence) or not all(isinstance(x, str) for x in choice):
                raise TypeError("choice must be a list of str (the outputs allowed)")
            if not choice:
                raise ValueError("choice is empty; pass None for no choice")
            object.__setattr__(self, "choice", tuple(choice))
        if self.logit_bias is not None:
            object.__setattr__(self, "logit_bias", _logit_bias(self.logit_bias))
        allowed = self.allowed_token_ids
        if allowed is not None:
            if isinstance(allowed, (str, bytes)) or not isinstance(allowed, Iterable):
                raise TypeError(f"allowed_token_ids must be a list of token ids, got {type(allowed).__name__}")
            allowed = tuple(sorted({_int("allowed_token_ids' token id", t) for t in allowed}))
            if not allowed:
                raise ValueError("allowed_token_ids is empty; pass None to allow every token")
            object.__setattr__(self, "allowed_token_ids", allowed)
        given = [name for name in ("json_schema", "grammar", "choice", "regex") if getattr(self, name) is not None]
        if len(given) > 1:
            raise ValueError(f"{' and '.join(given)} were both given; a prompt takes one constraint")
        _check_tools(self)
        object.__setattr__(self, "_params", _to_core(self))

    @classmethod
    def _from_options(cls, call: str, options: Dict[str, Any]) -> "SamplingParams":
        _check_names(call, options)
        return cls(**options)


def _check_tools(sp: SamplingParams) -> None:
    """tools (OpenAI's list of functions) kept as JSON text; tool_choice "auto" (the default
    with tools), "none", "required", or a function's name (or OpenAI's
    {"type": "function", "function": {"name": ...}}) kept as the name."""
    tools, choice = sp.tools, sp.tool_choice
    if tools is not None:
        if isinstance(tools, str):
            try:
                tools = json.loads(tools)
            except ValueError as e:
                raise ValueError(f"tools is not valid JSON: {e}") from None
        if isinstance(tools, (bytes, Mapping)) or not isinstance(tools, Sequence):
            raise TypeError(f"tools must be a list of {{'type': 'function', 'function': {{...}}}}, got {type(tools).__name__}")
        for i, t in enumerate(tools):
            fn = t.get("function") if isinstance(t, Mapping) else None
            if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or not fn["name"]:
                raise TypeError(f"tools[{i}] must be {{'type': 'function', 'function': {{'name': str, "
                                f"'description': str, 'parameters': JSON schema}}}}")
            if fn.get("parameters") is not None and not isinstance(fn["parameters"], Mapping):
                raise TypeError(f"tools[{i}]'s parameters must be a JSON schema (a dict)")
        if not tools:
            raise ValueError("tools is empty; pass None for no tools")
        try:
            object.__setattr__(sp, "tools", json.dumps(list(tools)))
        except (TypeError, ValueError) as e:
            raise TypeError(f"tools is not JSON-serialisable: {e}") from None
    if isinstance(choice, Mapping):
        fn = choice.get("function")
        if choice.get("type") != "function" or not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            raise TypeError("tool_choice must be 'auto', 'none', 'required' or "
                            "{'type': 'function', 'function': {'name': ...}}")
        choice = fn["name"]
        object.__setattr__(sp, "tool_choice", choice)
    if choice is not None:
        if not isinstance(choice, str) or not choice:
            raise TypeError(f"tool_choice must be 'auto', 'none', 'required' or a function's name, got {choice!r}")
        # tool_choice without tools, and tools with another constraint, the core refuses.
        if tools is not None and choice not in ("auto", "none", "required") and \
                choice not in [t["function"]["name"] for t in tools]:
            raise ValueError(f"tool_choice names function {choice!r}, which tools do not define")
    if not isinstance(sp.parallel_tool_calls, bool):
        raise TypeError(f"parallel_tool_calls must be a bool, got {type(sp.parallel_tool_calls).__name__}")


def _logit_bias(value: object) -> Tuple[Tuple[int, float], ...]:
    """A mapping (or pairs) of token id to bias as sorted (id, bias) pairs; -inf bans."""
    items = value.items() if isinstance(value, Mapping) else value
    if isinstance(items, (str, bytes)) or not isinstance(items, Iterable):
        raise TypeError(f"logit_bias must be a dict of token id to bias, got {type(value).__name__}")
    out = {}
    for pair in items:
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise TypeError("logit_bias must be a dict of token id to bias")
        token, bias = pair
        if isinstance(token, str):
            if not token.strip().lstrip("-").isdigit():
                raise TypeError(f"logit_bias's token ids are ints or decimal strs, got {token!r}"[:300])
            token = int(token)
        token = _int("logit_bias's token id", token)
        if isinstance(bias, bool) or not isinstance(bias, (int, float)):
            raise TypeError(f"logit_bias[{token}] must be a number, got {type(bias).__name__}")
        if math.isnan(bias) or bias == math.inf:
            raise ValueError(f"logit_bias[{token}] is {bias}: a bias is a finite number, or -math.inf to ban")
        out[token] = float(bias)
    return tuple(sorted(out.items()))


#: How each plain option is checked, by the type of the core's field; the options that are
#: not a plain number or bool are converted by name in _to_core.
_CHECKS = {bool: _bool, int: _int, float: _float}


def _to_core(sp: SamplingParams) -> _core.GenerateParams:
    params = _core.GenerateParams()
    for name, default in _FIELD_DEFAULTS:  # in order: the first bad option is named
        value = getattr(sp, name)
        if value is default:
            # The core's struct holds that default already, of the checked type: an engine's
            # submit makes one of these a prompt, and most options keep their defaults.
            continue
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
        elif name == "choice":
            if value is not None:
                params.choice = [_text(c, "choice") for c in value]
        elif name in ("json_schema", "grammar", "regex", "reasoning"):
            if value is not None:
                setattr(params, name, _text(value, name))
        elif name in ("logit_bias", "allowed_token_ids"):
            if value is not None:
                setattr(params, name, list(value))
        elif name in ("tools", "tool_choice"):
            if value is not None:
                setattr(params, name, value)  # checked and kept as text by _check_tools
        else:
            _set(params, name, _CHECKS[type(getattr(_GENERATE_DEFAULTS, name))](name, value))
    params.validate()  # ranges, from the core: ValueError naming the option
    return params


#: (name, default) of SamplingParams' fields, in their order.
_FIELD_DEFAULTS = tuple((field.name, field.default) for field in dataclasses.fields(SamplingParams))


#: The generation options every entry point takes as keywords: SamplingParams' fields, with
#: their defaults and, for signatures and help(), the types a keyword accepts (stop and
#: json_schema take more than the field keeps).
_KEYWORD_TYPES = {"stop": Union[None, str, Sequence[str]], "json_schema": Union[None, str, Mapping[str, Any]],
                  "choice": Optional[Sequence[str]], "logit_bias": Optional[Mapping[Union[int, str], float]],
                  "allowed_token_ids": Optional[Iterable[int]],
                  "tools": Union[None, str, Sequence[Mapping[str, Any]]],
                  "tool_choice": Union[None, str, Mapping[str, Any]]}
_HINTS = typing.get_type_hints(SamplingParams)
_OPTIONS = {field.name: (field.default, _KEYWORD_TYPES.get(field.name, _HINTS[field.name]))
            for field in dataclasses.fields(SamplingParams)}
SamplingParams.__init__ = _keywords_checked(SamplingParams.__init__)  # type: ignore[method-assign]


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
