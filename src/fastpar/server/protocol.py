"""OpenAI's request and response schemas, translated to and from fastpar's (no web
dependencies: ``fastpar serve`` and ``fastpar run`` share it)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, Dict, List, Optional, Tuple

import fastpar
from fastpar import Completion, SamplingParams

from .reasoning import reasoning_option
from .tools import message_calls, tool_messages, tool_options

#: Most samples (``n``) one request may ask for, and most prompts in one completions call
#: (``Limits``' defaults).
MAX_N = 128
MAX_PROMPTS = 1024
#: Largest request body, in MiB (``Limits``' default).
MAX_BODY_MIB = 16.0
#: Seconds a client should wait after a 429 or 503 before trying again.
RETRY_AFTER_S = 1
#: ``n_ctx_per_seq`` of ``fastpar serve`` and ``fastpar run``: both answer OpenAI-format
#: requests whose lengths are not known in advance, and the same request must behave the
#: same through either. The library's ``Context`` and ``Engine`` keep the core's smaller
#: default (the KV cache, ``n_parallel x n_ctx_per_seq`` positions, is allocated up front:
#: a library user sizes it for their prompts).
N_CTX_PER_SEQ = 4096
#: ``prefix_cache_mib`` of ``fastpar serve`` (``Context``'s -1: a quarter of the available
#: memory, at most 8 GiB): on, as llama-server's prompt cache is, for a chat's turns arrive
#: as separate requests. The library and ``fastpar run`` keep it off (docs/server.md).
SERVE_PREFIX_CACHE_MIB = -1


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one request may ask of ``fastpar serve`` (its ``--max-*`` options); a request over
    one is a 400 naming the field and the option. ``max_tokens`` None: up to the sequence's
    context (``n_ctx_per_seq``), also the default of a request that gives none."""

    max_body_mib: float = MAX_BODY_MIB
    max_n: int = MAX_N
    max_prompts: int = MAX_PROMPTS
    max_tokens: Optional[int] = None

    def __post_init__(self) -> None:
        for name in ("max_n", "max_prompts", "max_tokens"):
            value = getattr(self, name)
            if value is None and name == "max_tokens":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if isinstance(self.max_body_mib, bool) or not isinstance(self.max_body_mib, (int, float)) \
                or not self.max_body_mib > 0:
            raise ValueError(f"max_body_mib must be a number > 0, got {self.max_body_mib!r}")


#: The roles a chat message may have ("developer" is OpenAI's newer name for "system").
ROLES = ("system", "developer", "user", "assistant", "tool")

FINISH = {"stop": "stop", "length": "length", "tool_calls": "tool_calls"}


class APIError(Exception):
    """A request that gets an OpenAI error body instead of an answer."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: Optional[str] = None, code: Optional[str] = None,
                 headers: Optional[Dict[str, str]] = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = headers

    def body(self) -> Dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}



def _bad(param: str, message: str, code: Optional[str] = None) -> APIError:
    return APIError(400, message, param=param, code=code)


# -- reading a request body ---------------------------------------------------------------------

def _get(body: Mapping, name: str, kinds: Tuple[type, ...], what: str, default: Any = None) -> Any:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        raise _bad(name, f"'{name}' must be {what}, got {type(value).__name__}: {value!r}"[:300])
    return value


def _number(body: Mapping, name: str, lo: float, hi: float, default: Optional[float]) -> Optional[float]:
    value = _get(body, name, (int, float), "a number", default)
    if value is not None and not lo <= value <= hi:
        raise _bad(name, f"'{name}' must be between {lo:g} and {hi:g}, got {value}")
    return value


def _integer(body: Mapping, name: str, lo: int, hi: int, default: Optional[int]) -> Optional[int]:
    value = _get(body, name, (int,), "an integer", default)
    if value is not None and not lo <= value <= hi:
        raise _bad(name, f"'{name}' must be between {lo} and {hi}, got {value}")
    return value


def _content(content: Any, where: str) -> str:
    """A message's content: a str, or a list of text parts (other parts are refused)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise _bad(f"{where}[{j}]", f"'{where}[{j}]': only text content parts are supported")
            texts.append(part["text"])
        return "".join(texts)
    if content is None:
        return ""
    raise _bad(where, f"'{where}' must be a string or a list of text parts, got {type(content).__name__}")


def _messages(body: Mapping) -> List[Dict[str, str]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages", "'messages' must be a non-empty list of {'role', 'content'} objects")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            raise _bad(f"messages[{i}]", f"'messages[{i}]' must be an object with a string 'role'")
        role = m["role"]
        if role not in ROLES:
            raise _bad(f"messages[{i}].role", f"'messages[{i}].role' must be one of {', '.join(ROLES)}, "
                                              f"got {role!r}"[:300])
        if role == "developer":
            role = "system"  # what chat templates know
        out.append({"role": role, "content": _content(m.get("content"), f"messages[{i}].content")})
    return out


def _prompts(body: Mapping, limits: Limits) -> List[str]:
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        if len(prompt) > limits.max_prompts:
            raise _bad("prompt", f"'prompt' holds {len(prompt)} prompts; this server takes at most "
                                 f"{limits.max_prompts} in one request (--max-prompts)")
        return list(prompt)
    raise _bad("prompt", "'prompt' must be a string or a non-empty list of strings (token arrays are not supported)")


def _unsupported(body: Mapping, names: Tuple[str, ...]) -> None:
    for name in names:
        value = body.get(name)
        if value not in (None, [], {}, False):
            raise _bad(name, f"'{name}' is not supported by this server")


def _logit_bias(body: Mapping) -> Dict[str, float]:
    """OpenAI's logit_bias: token ids (as strings) to a bias from -100 to 100; false bans the
    token, as llama-server takes it. SamplingParams reads the ids (a bad one is a 400 naming
    logit_bias, as is an id outside the vocabulary, from the core)."""
    value = _get(body, "logit_bias", (dict,), "an object of token ids to biases", {})
    out: Dict[str, float] = {}
    for key, bias in value.items():
        if bias is False:
            out[key] = -math.inf
        elif isinstance(bias, bool) or not isinstance(bias, (int, float)) or not -100 <= bias <= 100:
            raise _bad("logit_bias", f"'logit_bias' values are numbers from -100 to 100 (false bans), got {bias!r}"[:300])
        else:
            out[key] = float(bias)
    return out


def _sampling(body: Mapping, chat: bool, n_ctx_per_seq: int, limits: Limits) -> Tuple[Dict[str, Any], int, int]:
    """The SamplingParams options, ``n`` and the number of top log-probabilities asked for."""
    opts: Dict[str, Any] = {}
    field = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _integer(body, field, 0, 1 << 30, None)
    if max_tokens is not None and limits.max_tokens is not None and max_tokens > limits.max_tokens:
        raise _bad(field, f"'{field}' is {max_tokens}; this server generates at most {limits.max_tokens} tokens "
                          "a request (--max-tokens)")
    # No limit given: until the model stops, the sequence's context is full or the cap is reached.
    if max_tokens is None:
        max_tokens = n_ctx_per_seq if limits.max_tokens is None else min(n_ctx_per_seq, limits.max_tokens)
    opts["max_tokens"] = max_tokens
    opts["temperature"] = float(_number(body, "temperature", 0.0, 2.0, 1.0))
    opts["top_p"] = float(_number(body, "top_p", 0.0, 1.0, 1.0))
    opts["presence_penalty"] = float(_number(body, "presence_penalty", -2.0, 2.0, 0.0))
    opts["frequency_penalty"] = float(_number(body, "frequency_penalty", -2.0, 2.0, 0.0))
    # llama.cpp's own sampling options, which many local clients send.
    top_k = _integer(body, "top_k", 0, 1 << 30, None)
    if top_k is not None:
        opts["top_k"] = top_k
    min_p = _number(body, "min_p", 0.0, 1.0, None)
    if min_p is not None:
        opts["min_p"] = float(min_p)
    repeat_penalty = _number(body, "repeat_penalty", 0.0, 10.0, None)
    if repeat_penalty is not None:
        opts["repeat_penalty"] = float(repeat_penalty)
    if _get(body, "ignore_eos", (bool,), "a boolean", False):
        opts["ignore_eos"] = True
    seed = _get(body, "seed", (int,), "an integer")
    if seed is not None:
        opts["seed"] = seed % (1 << 32)  # OpenAI takes any integer; the samplers take 32 bits
    stop = body.get("stop")
    if stop is not None:
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise _bad("stop", "'stop' must be a string or a list of strings")
        stop = [s for s in stop if s]
        if stop:
            opts["stop"] = stop
    bias = _logit_bias(body)
    if bias:
        opts["logit_bias"] = bias
    # vLLM's field: the only tokens generated.
    allowed = body.get("allowed_token_ids")
    if allowed is not None:
        if (not isinstance(allowed, list) or not allowed or
                not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in allowed)):
            raise _bad("allowed_token_ids", "'allowed_token_ids' must be a non-empty list of token ids (integers >= 0)")
        opts["allowed_token_ids"] = allowed
    # vLLM's field: a lower value takes a free slot before the requests queued with higher ones.
    priority = _integer(body, "priority", -(1 << 31), (1 << 31) - 1, None)
    if priority is not None:
        opts["priority"] = priority
    n = _integer(body, "n", 1, 1 << 30, 1)
    if n > limits.max_n:
        raise _bad("n", f"'n' is {n}; this server takes at most {limits.max_n} samples a request (--max-n)")
    if chat:
        want = _get(body, "logprobs", (bool,), "a boolean", False)
        k = _integer(body, "top_logprobs", 0, fastpar.MAX_TOP_LOGPROBS, 0)
        if k and not want:
            raise _bad("top_logprobs", "'top_logprobs' needs 'logprobs': true")
        n_top = k if want else -1
    else:
        k = _integer(body, "logprobs", 0, fastpar.MAX_TOP_LOGPROBS, None)
        n_top = -1 if k is None else k
    if n_top >= 0:
        opts["logprobs"] = True
        opts["top_logprobs"] = n_top
    fmt = body.get("response_format")
    if fmt is not None:
        if not isinstance(fmt, Mapping) or fmt.get("type") not in ("text", "json_object", "json_schema"):
            raise _bad("response_format", "'response_format.type' must be 'text', 'json_object' or 'json_schema'")
        if fmt["type"] == "json_object":
            opts["json_schema"] = {"type": "object"}  # any JSON object
        elif fmt["type"] == "json_schema":
            spec = fmt.get("json_schema")
            schema = spec.get("schema") if isinstance(spec, Mapping) else None
            if not isinstance(schema, Mapping):
                raise _bad("response_format", "'response_format' of type 'json_schema' needs "
                                              "'json_schema': {'name': ..., 'schema': {...}} with a JSON schema object"
                                              " (for any JSON object: {'type': 'json_object'})")
            opts["json_schema"] = dict(schema)
    # vLLM's extra fields: the output is exactly one of these strings, or matches this regex.
    choice = body.get("guided_choice")
    if choice is not None:
        if not isinstance(choice, list) or not choice or not all(isinstance(c, str) and c for c in choice):
            raise _bad("guided_choice", "'guided_choice' must be a non-empty list of non-empty strings")
        opts["choice"] = choice
    regex = body.get("guided_regex")
    if regex is not None:
        if not isinstance(regex, str) or not regex:
            raise _bad("guided_regex", "'guided_regex' must be a non-empty string (a regular expression)")
        opts["regex"] = regex
    given = [field for field, opt in (("response_format", "json_schema"), ("guided_choice", "choice"),
                                      ("guided_regex", "regex")) if opt in opts]
    if len(given) > 1:
        raise _bad(given[-1], f"{' and '.join(repr(g) for g in given)} each constrain the output: give one of them")
    return opts, n, n_top


def _param_of(message: str, default: str) -> str:
    names = {"tool_choice": "tool_choice", "parallel_tool_calls": "parallel_tool_calls", "tools": "tools",
             "json_schema": "response_format", "grammar": "response_format", "choice": "guided_choice",
             "regex": "guided_regex",
             "logit_bias": "logit_bias", "allowed_token_ids": "allowed_token_ids",
             "stop": "stop", "seed": "seed",
             "top_logprobs": "top_logprobs", "max_tokens": "max_tokens", "temperature": "temperature",
             "top_p": "top_p", "top_k": "top_k", "min_p": "min_p"}
    for key, param in names.items():
        if message.startswith(key) or f" {key}" in message[:40]:
            return param
    return default


def prompt_tokens(completions: List[Optional[Completion]], n_prompts: int, n: int) -> Tuple[int, int]:
    """(prompt tokens, those of them the prefix cache gave instead of a decode), counted
    once per prompt (its samples share it), as OpenAI counts them."""
    total = cached = 0
    for i in range(n_prompts):
        c = completions[i * n]
        if c is not None:
            # Scored with max_tokens 0, the prompt's last token is never decoded (its logits
            # would predict nothing), yet it is part of the prompt.
            seen = c.n_prompt_tokens + c.n_prompt_tokens_shared + c.n_prompt_tokens_cached
            total += max(seen, len(c.prompt_token_ids))
            cached += c.n_prompt_tokens_cached
    return total, cached


def usage(completions: List[Optional[Completion]], n_prompts: int, n: int) -> Dict[str, Any]:
    """OpenAI's usage object of the choices done; ``prompt_tokens_details.cached_tokens``:
    prompt tokens the prefix cache gave instead of a decode."""
    prompt, cached = prompt_tokens(completions, n_prompts, n)
    gen = sum(c.n_gen_tokens for c in completions if c is not None)
    return {"prompt_tokens": prompt, "completion_tokens": gen, "total_tokens": prompt + gen,
            "prompt_tokens_details": {"cached_tokens": cached}}


def _token_text(vocab: fastpar.Model, token: int, cache: Dict[int, bytes]) -> bytes:
    b = cache.get(token)
    if b is None:
        b = cache[token] = vocab.token_bytes(token)
    return b


def _chat_logprobs(vocab: fastpar.Model, c: Completion, n_top: int, cache: Dict[int, bytes]) -> Dict[str, Any]:
    content = []
    tops = c.top_logprobs
    for k, (token, lp) in enumerate(zip(c.token_ids, c.logprobs)):
        b = _token_text(vocab, token, cache)
        entry = {"token": b.decode("utf-8", "replace"), "logprob": lp, "bytes": list(b), "top_logprobs": []}
        if n_top > 0 and k < len(tops):
            for t_id, _text, t_lp in tops[k]:
                tb = _token_text(vocab, t_id, cache)
                entry["top_logprobs"].append({"token": tb.decode("utf-8", "replace"), "logprob": t_lp,
                                              "bytes": list(tb)})
        content.append(entry)
    return {"content": content, "refusal": None}


def _completion_logprobs(vocab: fastpar.Model, c: Completion, n_top: int, cache: Dict[int, bytes],
                         echo: bool = False) -> Dict[str, Any]:
    """OpenAI's legacy `logprobs` object; with `echo` the prompt's tokens come first (the
    first with null log-probability and alternatives, as nothing predicts it)."""
    tokens, offsets, tops, values = [], [], [], []
    pos = 0
    if echo:
        for k, token in enumerate(c.prompt_token_ids):
            text = _token_text(vocab, token, cache).decode("utf-8", "replace")
            tokens.append(text)
            offsets.append(pos)
            pos += len(text)
            lp = c.prompt_logprobs[k]
            values.append(lp)
            alts = c.prompt_top_logprobs[k] if k < len(c.prompt_top_logprobs) else []
            tops.append(None if lp is None else {_token_text(vocab, t, cache).decode("utf-8", "replace"): v
                                                 for t, _text, v in alts})
    values += list(c.logprobs)
    for k, token in enumerate(c.token_ids):
        text = _token_text(vocab, token, cache).decode("utf-8", "replace")
        tokens.append(text)
        offsets.append(pos)
        pos += len(text)
        if n_top > 0 and k < len(c.top_logprobs):
            tops.append({_token_text(vocab, t, cache).decode("utf-8", "replace"): lp
                         for t, _text, lp in c.top_logprobs[k]})
        else:
            tops.append(None)
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops if n_top > 0 else None,
            "text_offset": offsets}




@dataclasses.dataclass
class Parsed:
    """One chat or completions request, checked."""

    chat: bool
    prompts: List[Any]  # one message list (chat), or the prompt strings
    opts: Dict[str, Any]  # SamplingParams options (without n)
    n: int
    n_top: int  # -1: no log-probabilities; else how many alternatives per token
    stream: bool
    include_usage: bool
    echo: bool
    model: Optional[str]

    @property
    def param(self) -> str:
        return "messages" if self.chat else "prompt"

    def choice_param(self, k: int) -> str:
        """The field choice ``k`` answers: ``prompt[i]`` for prompt i of a list."""
        return f"prompt[{k // self.n}]" if len(self.prompts) > 1 else self.param

    def sampling_params(self) -> SamplingParams:
        """The request's SamplingParams, ``n`` included: sample j is seeded seed + j."""
        try:
            return SamplingParams(n=self.n, **self.opts)
        except (TypeError, ValueError) as e:
            raise _bad(_param_of(str(e), self.param), str(e)) from None


def parse(body: Any, chat: bool, n_ctx_per_seq: int, limits: Limits = Limits(), thinks: bool = False) -> Parsed:
    """A request body (parsed JSON) as a Parsed request; APIError (400 naming the field).
    ``thinks``: the model's chat template writes thoughts, which chat answers then split off
    (reasoning.py)."""
    if not isinstance(body, Mapping):
        raise APIError(400, "the request body must be a JSON object")
    tools = None
    if chat:
        _unsupported(body, ("functions", "audio"))
        tools = tool_options(body, _bad)
        prompts: List[Any] = [tool_messages(body, _content, _bad) if tools else _messages(body)]
    else:
        _unsupported(body, ("suffix",))
        prompts = _prompts(body, limits)
    stream = _get(body, "stream", (bool,), "a boolean", False)
    so = body.get("stream_options")
    if so is not None and not isinstance(so, Mapping):
        raise _bad("stream_options", "'stream_options' must be an object")
    include_usage = bool(so and so.get("include_usage")) and stream
    echo = False if chat else _get(body, "echo", (bool,), "a boolean", False)
    opts, n, n_top = _sampling(body, chat, n_ctx_per_seq, limits)
    if chat:
        reasoning = reasoning_option(body, thinks, _bad)
        if reasoning is not None:
            opts["reasoning"] = reasoning
        if tools:
            opts.update(tools)
    if echo and n_top >= 0:
        opts["prompt_logprobs"] = True  # the prompt's tokens get log-probabilities too
    model = body.get("model") if isinstance(body.get("model"), str) else None
    return Parsed(chat, prompts, opts, n, n_top, stream, include_usage, echo, model)


def prompt_failure(c: Completion, param: str) -> Optional[APIError]:
    """A prompt that could not be served (too long, empty, ...) is the request's 400."""
    if c.finish_reason == "error" and c.n_gen_tokens == 0:
        for field in ("logit_bias", "allowed_token_ids"):  # a token id outside the vocabulary
            if (c.error or "").startswith(field + " "):
                return _bad(field, c.error or "")
        code = "context_length_exceeded" if "n_ctx_per_seq" in (c.error or "") else None
        message = c.error or "the prompt failed"
        return _bad(param, message if param in ("prompt", "messages") else f"'{param}': {message}", code)
    return None


def failure(c: Completion, param: str) -> Optional[APIError]:
    """Why a finished completion is no answer (None if it is one)."""
    if c.finish_reason in FINISH:
        return None
    if c.finish_reason == "cancelled":
        return APIError(503, "the request was cancelled: the server is shutting down", "server_error",
                        code="cancelled")
    return prompt_failure(c, param) or APIError(500, f"generation failed: {c.error}", "server_error")


def response_body(req: Parsed, rid: str, created: int, model: str, completions: List[Completion],
                  vocab: fastpar.Model) -> Dict[str, Any]:
    """The chat.completion or text_completion object of finished, successful completions
    (prompt after prompt, each prompt's n samples in order)."""
    cache: Dict[int, bytes] = {}
    choices = []
    for k, c in enumerate(completions):
        if req.chat:
            message = {"role": "assistant", "content": c.text, "refusal": None}
            if c.reasoning:
                message["reasoning_content"] = c.reasoning
            if c.tool_calls:
                message["tool_calls"] = message_calls(c)
                message["content"] = c.text or None
            choices.append({"index": k, "message": message,
                            "logprobs": _chat_logprobs(vocab, c, req.n_top, cache) if req.n_top >= 0 else None,
                            "finish_reason": FINISH[c.finish_reason]})
        else:
            prefix = req.prompts[k // req.n] if req.echo else ""
            choices.append({"index": k, "text": prefix + c.text,
                            "logprobs": (_completion_logprobs(vocab, c, req.n_top, cache, req.echo)
                                         if req.n_top >= 0 else None),
                            "finish_reason": FINISH[c.finish_reason]})
    return {"id": rid, "object": "chat.completion" if req.chat else "text_completion", "created": created,
            "model": model, "system_fingerprint": None, "choices": choices,
            "usage": usage(completions, len(req.prompts), req.n)}


def chunk_logprobs(req: Parsed, c: Completion, vocab: fastpar.Model, cache: Dict[int, bytes]) -> Any:
    if req.n_top < 0:
        return None
    return (_chat_logprobs(vocab, c, req.n_top, cache) if req.chat
            else _completion_logprobs(vocab, c, req.n_top, cache, req.echo))
