"""An lm-evaluation-harness backend: ``FastparLM``, registered as ``fastpar``.

    import lm_eval, fastpar.lm_eval
    lm = fastpar.lm_eval.FastparLM("model.gguf", n_parallel=16)
    results = lm_eval.simple_evaluate(model=lm, tasks=["hellaswag"])

or from the command line: ``lm_eval --model fastpar --model_args model=model.gguf,n_parallel=16``.
Needs the ``lm-eval`` extra (``pip install 'fastpar[lm-eval]'``). Every request of a task
goes to fastpar at once, so the one loop decodes them side by side and a context shared by
several continuations once (docs/api.md, "Scoring").
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Tuple, Union

import lm_eval.models  # noqa: F401
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model

import fastpar
from fastpar import Context, Model, SamplingParams

__all__ = ["FastparLM"]

# lm-evaluation-harness's own default for generate_until's max_gen_toks.
_DEFAULT_MAX_GEN_TOKS = 256


def _number(value: Any, kind: type) -> Any:
    # Values from --model_args arrive as text or as numbers parsed by lm-eval.
    if kind is bool and isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return kind(value) if value is not None else None


# lm-eval fills its registry with its own models only while the registry is empty (its
# get_model): they are imported above, before "fastpar" is added, so both stay reachable.
@register_model("fastpar")
class FastparLM(TemplateLM):
    """lm-evaluation-harness model over a fastpar ``Context``.

    ``model``: a ``fastpar.Context`` (used as it is), a GGUF path, or None for fastpar's
    default model (``pretrained`` is accepted as another name for the path, as lm-eval's
    other backends take it). With a path, a Context is made with ``n_parallel``,
    ``n_ctx_per_seq``, ``n_threads``, ``n_gpu_layers`` and ``share_prefixes``.
    lm-eval's ``batch_size``, ``max_batch_size`` and ``device`` are accepted and ignored:
    every request of a call is submitted at once and fastpar batches them itself.

    ``loglikelihood``: lm-eval's own tokenization of each pair (``TemplateLM``, with
    ``tok_encode`` = the model's tokenizer, BOS as the vocabulary asks), scored by
    ``fastpar.loglikelihood``'s engine; a pair longer than ``n_ctx_per_seq + 1`` tokens
    loses context tokens from the left. ``loglikelihood_rolling``: as
    ``fastpar.loglikelihood_rolling``. ``generate_until``: greedy unless ``do_sample``,
    stopping at ``until`` (and the end-of-generation token) or ``max_gen_toks``; a context too
    long for the window keeps its last tokens. A request fastpar cannot serve raises
    ``RuntimeError`` with its message (a score must not be silently missing).
    """

    def __init__(self, model: Union[None, str, os.PathLike, Context] = None, *, pretrained: Optional[str] = None,
                 n_parallel: int = 16, n_ctx_per_seq: int = 2048, n_threads: Optional[int] = None,
                 n_gpu_layers: int = 0, share_prefixes: bool = True, batch_size: Any = None,
                 max_batch_size: Any = None, device: Any = None, **kwargs: Any) -> None:
        super().__init__()
        if kwargs:
            raise TypeError(f"FastparLM got unexpected arguments: {', '.join(sorted(kwargs))}")
        if model is None:
            model = pretrained
        if isinstance(model, Context):
            self.ctx = model
        else:
            if model is None:
                model = fastpar.default_model_path()
            m = Model(model, n_gpu_layers=_number(n_gpu_layers, int))
            self.ctx = Context(m, n_parallel=_number(n_parallel, int), n_ctx_per_seq=_number(n_ctx_per_seq, int),
                               n_threads=_number(n_threads, int), share_prefixes=_number(share_prefixes, bool))

    # -- tokenization (TemplateLM) ------------------------------------------------------

    @property
    def eot_token_id(self) -> int:
        return self.ctx.model.token_eos

    @property
    def prefix_token_id(self) -> int:
        return self.ctx.model.prefix_token

    @property
    def max_length(self) -> int:
        return self.ctx.n_ctx_per_seq

    @property
    def tokenizer_name(self) -> str:
        return os.path.basename(self.ctx.model.path)

    def tok_encode(self, string: str, add_special_tokens: Optional[bool] = None, **kwargs: Any) -> List[int]:
        add = True if add_special_tokens is None else bool(add_special_tokens)
        return self.ctx.model.tokenize(string, add_special=add)

    def apply_chat_template(self, chat_history: List[Dict[str, str]], add_generation_prompt: bool = True) -> str:
        return self.ctx.model.apply_chat_template(chat_history)

    # -- requests -------------------------------------------------------------------------

    def _loglikelihood_tokens(self, requests: List[Tuple[Tuple[str, str], List[int], List[int]]],
                              disable_tqdm: bool = False, **kwargs: Any) -> List[Tuple[float, bool]]:
        pairs = [(context_enc, continuation_enc) for _, context_enc, continuation_enc in requests]
        scores = fastpar.loglikelihood(self.ctx, pairs, progress=not disable_tqdm)
        out = []
        for (key, _, _), s in zip(requests, scores):
            if s.error is not None:
                raise RuntimeError(f"fastpar could not score {key!r}: {s.error}")
            answer = (s.logprob, bool(s.is_greedy))
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, answer)
            out.append(answer)
        return out

    def loglikelihood_rolling(self, requests: List[Any], disable_tqdm: bool = False) -> List[float]:
        texts = [req.args[0] for req in requests]
        scores = fastpar.loglikelihood_rolling(self.ctx, texts, progress=not disable_tqdm)
        out = []
        for text, s in zip(texts, scores):
            if s.error is not None:
                raise RuntimeError(f"fastpar could not score a text: {s.error}")
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), float(s))
            out.append(float(s))
        return out

    def generate_until(self, requests: List[Any], disable_tqdm: bool = False) -> List[str]:
        prompts: List[List[int]] = []
        params: List[SamplingParams] = []
        for req in requests:
            context, gen_kwargs = req.args
            kw = dict(gen_kwargs or {})
            until = kw.pop("until", None)
            if isinstance(until, str):
                until = [until]
            max_gen = int(kw.pop("max_gen_toks", _DEFAULT_MAX_GEN_TOKS))
            do_sample = bool(kw.pop("do_sample", False))
            temperature = float(kw.pop("temperature", 0.0) or 0.0)
            sp = SamplingParams(max_tokens=max_gen, temperature=temperature if do_sample else 0.0,
                                stop=[u for u in until or [] if u] or None, seed=int(kw.pop("seed", 0) or 0))
            # As lm-eval's causal backends: a context too long keeps its last tokens,
            # leaving room for max_gen_toks (and at least one token of context).
            tokens = self.tok_encode(context)
            keep = max(1, self.ctx.n_ctx_per_seq - max_gen)
            prompts.append(tokens[-keep:])
            params.append(sp)
        bar = None
        if not disable_tqdm:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(prompts), unit="request", desc="fastpar generate_until")
        try:
            completions = fastpar.generate_parallel(self.ctx, prompts, params,
                                                    on_completion=(lambda i, c: bar.update(1)) if bar else None)
        finally:
            if bar is not None:
                bar.close()
        out = []
        for req, c in zip(requests, completions):
            if c.finish_reason == "error":
                raise RuntimeError(f"fastpar could not generate for a request: {c.error}")
            self.cache_hook.add_partial("generate_until", req.args, c.text)
            out.append(c.text)
        return out
